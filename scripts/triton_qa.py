"""Run Triton's own Python-backend QA (``qa/L0_backend_python``) against fastoip, or against real tritonserver.

Usage (``make triton-qa SNAPSHOT=<path> [SERVER=triton]``)::

    python scripts/triton_qa.py --snapshot <server> [--python-backend <python_backend>] [--suite NAME ...]
        [--server fastoip|triton] [--json results.json]
    python scripts/triton_qa.py --compare <fastoip.json or folder> <triton.json or folder>

``--server triton`` runs the same selection, with the same shims, against the reference: the tritonserver binary
and Python backend of the nvidia-pytriton wheel in the peers lab's ``venv-triton`` (``--triton-venv``; the
environment ``serve_repo.sh`` sets up: the wheel's libraries on LD_LIBRARY_PATH, its Python backend and stub as
TRITON_DIR/backends/python), without fastoip's shims of server behaviour (no added ``--exit-on-error``), and
leaving out the few flags newer than the wheel's 2.51 (NEWER_FLAGS). ``--json`` writes each case (suite, case,
passed); ``--compare`` lists the cases Triton passes and fastoip fails (the goal), the reverse, and those both
fail. Run it under ``flock /tmp/triton-qa.lock`` where others may run it: the ports are fixed.

``<server>`` is a checkout of triton-inference-server/server, an extracted tree holding ``qa/``, or a bare git
directory (read with ``git archive HEAD qa``); ``<python_backend>`` likewise for the sub-suites that clone
python_backend for its examples. Triton's files are read from there at run time, never kept in this project.

How it runs: each selected sub-suite's own ``test.sh`` runs unchanged in a scratch copy of the snapshot's ``qa/``,
so its model repository is built by its own ``cp``/``sed`` and its server started with its own flags. The scripts
start ``$TRITON_DIR/bin/tritonserver``; here that is a shim that runs ``fastoip serve`` with the same arguments
(fastoip accepts tritonserver's flags) after ``--exit-on-error=true``, Triton's default (fastoip's default
deliberately keeps serving; COMPATIBILITY.md). It first moves the models whose ``model.py`` imports torch out of the
repository (no PyTorch here; the cases that use them fail). Other shims on ``PATH``: ``python3`` is this interpreter
and gives each ``pytest --junitxml`` run a report of its own (some suites reuse one name), ``pip`` / ``pip3``
install nothing (the venv has the dependencies; the torch/JAX installs are for skipped cases), ``git clone
.../python_backend`` copies the given python_backend snapshot (no network), ``gdb`` does nothing, and a stand-in
``triton_shm_monitor`` module lets ``shm_util`` import (Triton builds it to read its python backend's shared-memory
pool, which fastoip does not have: the leak probe finds no pool to read). ``common/util.sh``'s readiness wait reads
curl's status code alone (it compares body and code as one string; fastoip's server health answers a body, a
deliberate difference in COMPATIBILITY.md). The top-level ``test.sh``'s start checks run from a copy cut before its
sub-suite loop, without its Python 3.12 version checks (this venv's Python is the one that matters). Where it may
(root), each suite runs with a private ``/dev/shm`` (a mount namespace with its own tmpfs): the suites count
``/dev/shm`` entries before and after a server, and other processes of the machine must not change that count.

Totals: every ``<testcase>`` of every JUnit report a suite writes (``pytest --junitxml``), plus, for the clients a
``test.sh`` runs without JUnit, the suite's exit status. Triton's servers listen on 8000-8002, which the tests
hard-code: run this where nothing else holds those ports.

Skipped, with reasons (``SKIPPED``): GPU, PyTorch, conda environments, custom server builds.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

#: The sub-suites that run on a CPU host with numpy, in test.sh's order.
SELECTED = (
    "start_checks",
    "ensemble",
    "bls",
    "decoupled",
    "response_sender",
    "io",
    "async_execute",
    "lifecycle",
    "argument_validation",
    "logging",
    "custom_metrics",
    "parameters",
    "model_control",
    "examples",
    "request_rescheduling",
    "model_readiness",
)

#: The sub-suites not run, and why.
SKIPPED = {
    "env": "builds conda environments (conda-pack) for EXECUTION_ENV_PATH",
    "variants": "builds a custom python_backend stub with cmake",
    "python_based_backends": "needs PyTorch (a PyTorch-based backend and a libtorch model)",
    "restart": "Triton's own test.sh does not run it (decoupled restart not reimplemented)",
}

#: Environment a sub-suite runs with beside the common one: ensemble's TEST_WINDOWS=1 path is its CPU-only one
#: (the other adds a libtorch model on KIND_GPU).
SUITE_ENV = {
    "start_checks": {"TEST_JETSON": "1"},  # the top level's KIND_GPU model check and its torch install
    "ensemble": {"TEST_WINDOWS": "1"},
}

PLAIN_NAMES = ("pip", "pip3")

#: tritonserver flags the suites pass that real Triton 2.51 (the reference) does not know, each with what 2.51 does
#: without it: the shim leaves them out there.
NEWER_FLAGS = {
    "--allow-client-shm": "2.51 always allows clients' shared-memory regions (the flag's default, true)",
}


@dataclass
class SuiteResult:
    name: str
    exit_status: int
    seconds: float
    passed: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def extract_tree(source: Path, subdir: str, target: Path) -> Path:
    """``source``'s ``subdir`` copied into ``target``: from a tree, or archived out of a bare git dir."""
    if target.exists():
        shutil.rmtree(target)
    if (source / subdir).is_dir():
        shutil.copytree(source / subdir, target / subdir, symlinks=True)
        return target
    if (source / "HEAD").is_file() and (source / "objects").is_dir():
        target.mkdir(parents=True)
        archive = subprocess.run(
            ["git", f"--git-dir={source}", "archive", "HEAD", subdir], check=True, capture_output=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(target)], input=archive, check=True)
        return target
    raise SystemExit(f"{source}: neither a tree with {subdir}/ nor a bare git directory")


def write_shim(path: Path, body: str) -> None:
    path.write_text("#!/bin/bash\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


@dataclass
class RealTriton:
    """Where real tritonserver lives: the nvidia-pytriton wheel's binary, its Python backend and its stub, in the
    peers lab's ``venv-triton`` (the environment ``serve_repo.sh`` sets up, reproduced here: the suites pass
    ``--model-repository``/``--backend-directory`` themselves, so that script's own ones would be doubled)."""

    venv: Path

    @property
    def root(self) -> Path:
        found = sorted(self.venv.glob("lib/python3*/site-packages/pytriton/tritonserver"))
        if not found or not (found[0] / "bin" / "tritonserver").is_file():
            raise SystemExit(f"no tritonserver in {self.venv} (the peers lab's setup.sh makes it)")
        return found[0]

    def install_backend(self, backends: Path) -> None:
        """The wheel's Python backend and the stub for the venv's Python version, as TRITON_DIR/backends/python."""
        python = backends / "python"
        python.mkdir(parents=True, exist_ok=True)
        for item in (self.root / "backends" / "python").iterdir():
            if item.is_file():
                shutil.copy2(item, python)
        version = subprocess.run([str(self.venv / "bin" / "python"), "-c",
                                  "import sys; print(f'{sys.version_info[0]}.{sys.version_info[1]}')"],
                                 check=True, capture_output=True, text=True).stdout.strip()
        shutil.copy2(self.root / "python_backend_stubs" / version / "triton_python_backend_stub", python)

    def library_path(self) -> str:
        """The wheel's shared libraries (pytriton's and NVIDIA's) for the loader."""
        folders = sorted({str(lib.parent) for lib in self.venv.glob("lib/python3*/site-packages/**/*.so*")
                          if "pytriton" in str(lib) or "nvidia" in str(lib)})
        return ":".join([*folders, *filter(None, [os.environ.get("LD_LIBRARY_PATH", "")])])

    @staticmethod
    def set_aside_onnx(aside: Path) -> str:
        """Shim lines that move the ONNX models out of the repository: the wheel ships no onnxruntime backend, and a
        model that cannot load stops Triton at start (its default --exit-on-error); the cases that use them fail."""
        return (
            'if [ -n "$repo" ]; then for d in "$repo"/*/; do d="${d%/}"\n'
            '  if grep -qs onnxruntime "$d/config.pbtxt" || ls "$d"/*/model.onnx >/dev/null 2>&1; then\n'
            f'    mkdir -p {aside}; rm -rf "{aside}/$(basename "$d")"\n'
            f'    mv "$d" {aside}/ && echo "triton-qa: model $(basename "$d") needs ONNX Runtime: not served" >&2\n'
            '  fi; done; fi\n'
        )

    def command(self, clean_pythonpath: str) -> str:
        """The shim's exec line: the stub embeds the venv's Python (its bin first on PATH, as serve_repo.sh does);
        the models see the suites' PYTHONPATH without fastoip's sources. The flags newer than the wheel's 2.51
        are left out (NEWER_FLAGS: 2.51 behaves as their default)."""
        drop = "|".join(f"{flag}|{flag}=*" for flag in NEWER_FLAGS)
        return (f'export PATH="{self.venv}/bin:$PATH" LD_LIBRARY_PATH="{self.library_path()}" '
                f'PYTHONPATH="{clean_pythonpath}"\n'
                f'args=(); for a in "$@"; do case "$a" in {drop}) ;; *) args+=("$a");; esac; done\n'
                f'exec {self.root}/bin/tritonserver "${{args[@]}}"\n')


def make_shims(triton_dir: Path, python_backend: Path | None, triton: RealTriton | None = None,
               clean_pythonpath: str = "") -> Path:
    """``triton_dir`` made a TRITON_DIR whose ``bin/tritonserver`` is fastoip, or real tritonserver given
    ``triton`` (its ``qa/`` is the scratch copy: the init_args model expects its repository at TRITON_DIR/qa/...);
    a bin directory of tool shims for PATH."""
    for folder in ("bin", "backends", "shims", "set-aside"):
        if (triton_dir / folder).exists():
            shutil.rmtree(triton_dir / folder)
    (triton_dir / "bin").mkdir(parents=True)
    (triton_dir / "backends").mkdir()
    py = sys.executable
    # Models whose model.py imports torch are moved out of the repository first (no PyTorch here: Triton would not
    # start without them either); the cases that use them fail and are listed.  --exit-on-error=true first:
    # Triton's default, which fastoip's deliberately is not (COMPATIBILITY.md); the suites' own flags win.
    aside = triton_dir / "set-aside"
    if triton is not None:
        triton.install_backend(triton_dir / "backends")
        server = triton.command(clean_pythonpath)
    else:
        server = (f'exec {py} -c "import sys; from fastoip.cli import main; sys.exit(main())" '
                  'serve --exit-on-error=true "$@"\n')
    write_shim(
        triton_dir / "bin" / "tritonserver",
        'for a in "$@"; do case "$a" in --model-repository=*|--model-store=*) repo="${a#*=}";; esac; done\n'
        'if [ -n "$repo" ]; then for f in "$repo"/*/*/model.py; do\n'
        '  if [ -f "$f" ] && grep -qE "^[[:space:]]*(import torch|from torch)" "$f"; then\n'
        f'    d=$(dirname "$(dirname "$f")"); mkdir -p {aside}; rm -rf "{aside}/$(basename "$d")"\n'
        f'    mv "$d" {aside}/ && echo "triton-qa: model $(basename "$d") needs PyTorch: not served" >&2\n'
        '  fi; done; fi\n' + (triton.set_aside_onnx(aside) if triton is not None else "") + server,
    )
    tools = triton_dir / "shims"
    tools.mkdir()
    # Each pytest run's JUnit report gets a name of its own (some suites reuse one name for several runs).
    unique_junit = ('args=(); for a in "$@"; do case "$a" in --junitxml=*) a="${a%.xml}.$(date +%s%N).xml";; esac; '
                    'args+=("$a"); done\n')
    write_shim(tools / "python3", unique_junit + f'exec {py} "${{args[@]}}"\n')
    write_shim(tools / "python", unique_junit + f'exec {py} "${{args[@]}}"\n')
    write_shim(tools / "pytest", unique_junit + f'exec {py} -m pytest "${{args[@]}}"\n')
    # Triton's QA builds triton_shm_monitor (a C++ reader of its python backend's shared-memory pool, the
    # "triton_python_backend_shm_region*" objects) for shm_util's leak probe. fastoip makes no such pool, so the probe
    # finds none to open there; real Triton's pools are found, and this stand-in reports a constant free size for
    # them: the leak probe measures nothing on either server (the module is a build product of Triton's QA).
    (tools / "triton_shm_monitor.py").write_text(
        "class SharedMemoryManager:\n"
        "    def __init__(self, name):\n"
        "        self.name = name\n"
        "    def free_memory(self):\n"
        "        return 0\n"
    )
    write_shim(tools / "gdb", "exit 0\n")  # util.sh's hang helper: no core dumps of a server that did not start
    for name in PLAIN_NAMES:
        write_shim(tools / name, 'echo "triton-qa: skipped: $0 $*"\n')
    clone = f"cp -r {python_backend}/. python_backend && exit 0" if python_backend else "echo no snapshot; exit 1"
    write_shim(
        tools / "git",
        'if [ "$1" = clone ] && [[ "$2" == */python_backend ]]; then ' + clone + "; fi\n"
        f'exec {shutil.which("git")} "$@"\n',
    )
    return tools


def make_data(qa: Path, data: Path) -> None:
    """The part of Triton's QA data set (DATADIR) the selection reads that fastoip can serve: the ONNX implicit-state
    sequence models (bls), made by Triton's own generator.  (Its libtorch models need PyTorch: not made.)"""
    target = data / "qa_sequence_implicit_model_repository"
    if not target.is_dir():
        subprocess.run([sys.executable, str(qa / "common" / "gen_qa_implicit_models.py"), "--onnx",
                        "--models_dir", str(target)], check=True, cwd=qa / "common")


def adapt_util(util: Path) -> None:
    """util.sh's readiness wait reads the status code alone (fastoip's server health answers a body)."""
    text = util.read_text()
    for endpoint in ("ready", "live"):
        text = text.replace(f"curl -s -w %{{http_code}} ${{SERVER_IPADDR}}:8000/v2/health/{endpoint}",
                            f"curl -s -o /dev/null -w %{{http_code}} ${{SERVER_IPADDR}}:8000/v2/health/{endpoint}")
    util.write_text(text)


def start_checks_script(l0: Path) -> Path:
    """The top-level test.sh up to its sub-suite loop, without its Python 3.12 checks."""
    text = (l0 / "test.sh").read_text()
    cut = text.index('if [ "$TEST_JETSON" == "0" ]; then\n    SUBTESTS=')
    body = text[:cut]
    body = body.replace('python3 --version | grep "3.12" > /dev/null', "true")
    body = body.replace('python3 --version | grep "3.${PYTHON_ENV_VERSION}" > /dev/null', "true")
    # The models that import torch (skipped: no PyTorch here) and their test cases.
    body = re.sub(r"mkdir -p models/pytorch_fp32_fp32/1/\n(?:    .*\n)+", "", body)
    body = re.sub(r"mkdir -p models/identity_bf16/1/\n(?:cp .*identity_bf16.*\n)+", "", body)
    deselect = "-k 'not test_infer_pytorch and not test_bf16'"
    body = body.replace("--junitxml=L0_backend_python.report.xml $CLIENT_PY",
                        f"--junitxml=L0_backend_python.report.xml {deselect} $CLIENT_PY")
    body += "\nexit $RET\n"
    script = l0 / "start_checks.sh"
    script.write_text(body)
    return script


def private_shm_prefix() -> list[str]:
    """A command prefix that gives a suite a /dev/shm of its own (a mount namespace with a fresh tmpfs), so the
    suites' shared-memory page counts see only their own server; empty where that is not allowed (not root)."""
    prefix = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
              'mount -t tmpfs -o size=1g tmpfs /dev/shm && exec "$@"', "private-shm"]
    if shutil.which("unshare") is None:
        return []
    probe = subprocess.run([*prefix, "true"], capture_output=True)
    return prefix if probe.returncode == 0 else []


def junit_cases(directory: Path, since: float) -> tuple[list[str], list[str], list[str]]:
    """The cases of the JUnit reports written since ``since``, named ``report::class.case`` where ``report`` is the
    name the suite gave it (the python3 shim's time stamp taken off, so that two runs' names match); a report name
    a suite reuses is numbered in the order written (``report#2``)."""
    passed: list[str] = []
    failed: list[str] = []
    skipped: list[str] = []
    seen: dict[str, int] = {}
    # The shim's suffix is a nanosecond time stamp of fixed width: sorted by name is sorted by time per report name.
    for report in sorted(directory.rglob("*.xml")):
        if report.stat().st_mtime < since:
            continue
        try:
            tree = ET.parse(report)
        except ET.ParseError:
            continue
        stem = re.sub(r"\.\d{19}$", "", report.stem)
        key = f"{report.parent.relative_to(directory)}/{stem}"
        seen[key] = seen.get(key, 0) + 1
        label = stem if seen[key] == 1 else f"{stem}#{seen[key]}"
        for case in tree.iter("testcase"):
            name = f"{label}::{case.get('classname', '')}.{case.get('name', '')}"
            if case.find("failure") is not None or case.find("error") is not None:
                failed.append(name)
            elif case.find("skipped") is not None:
                skipped.append(name)
            else:
                passed.append(name)
    return passed, failed, skipped


def adapt_model_readiness(suite: Path) -> None:
    """model_readiness finds the stub to kill by its name: fastoip's is ``python -m fastoip.pyworker`` (the
    pattern still finds Triton's, so the same script runs against both)."""
    script = suite / "test.sh"
    text = script.read_text()
    script.write_text(text.replace('pgrep -f "triton_python_backend_stub"',
                                   'pgrep -f "triton_python_backend_stub|fastoip[.]pyworker"'))


def run_suite(name: str, l0: Path, env: dict[str, str], timeout: float, prefix: list[str]) -> SuiteResult:
    if name == "model_readiness":
        adapt_model_readiness(l0 / name)
    if name == "start_checks":
        cwd, argv = l0, ["bash", "-x", str(start_checks_script(l0))]
    else:
        cwd, argv = l0 / name, ["bash", "-ex", "test.sh"]
    suite_env = dict(env, **SUITE_ENV.get(name, {}))
    started = time.time()
    log = (l0.parent / f"triton-qa.{name}.out").open("w")  # beside, not in: the scripts remove *.log
    suite = subprocess.Popen([*prefix, *argv], cwd=cwd, env=suite_env, stdout=log, stderr=subprocess.STDOUT,
                             start_new_session=True)
    try:
        status = suite.wait(timeout)
    except subprocess.TimeoutExpired:
        status = 124
    finally:
        log.close()
        # What the suite left running (a server it did not stop, a client that hangs) ends with it.
        for signum in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(suite.pid, signum)
            except ProcessLookupError:
                break
            time.sleep(2)
    passed, failed, skipped = junit_cases(cwd if name != "start_checks" else l0, started)
    result = SuiteResult(name, status, time.time() - started, passed, failed, skipped)
    # The script's own checks (server start, log lines, clients run without JUnit) count as one case.
    (result.passed if status == 0 else result.failed).append(f"{name}/test.sh")
    return result


def case_rows(results: list[SuiteResult]) -> list[dict[str, object]]:
    """One row per case: suite, case, passed (skipped cases are left out: neither passed nor failed)."""
    return [{"suite": r.name, "case": case, "passed": ok}
            for r in results for ok, cases in ((True, r.passed), (False, r.failed)) for case in cases]


def load_rows(path: Path) -> dict[tuple[str, str], bool]:
    """A run's cases from its --json file, or from every ``*.json`` of a folder (suites run one at a time)."""
    rows: dict[tuple[str, str], bool] = {}
    for file in sorted(path.glob("*.json")) if path.is_dir() else [path]:
        data = json.loads(file.read_text())
        rows.update({(str(row["suite"]), str(row["case"])): bool(row["passed"]) for row in data["cases"]})
    return rows


def compare(fastoip: dict[tuple[str, str], bool], triton: dict[tuple[str, str], bool],
            suites: set[str] | None = None) -> dict[str, list[tuple[str, str]]]:
    """The two servers' results side by side; a case one run lacks (its suite did not get that far) counts as
    failed there. ``suites`` limits it to the suites both ran."""
    keys = sorted(k for k in set(fastoip) | set(triton) if suites is None or k[0] in suites)
    groups: dict[str, list[tuple[str, str]]] = {"triton_only": [], "fastoip_only": [], "both_fail": [],
                                                "both_pass": []}
    for key in keys:
        ours, theirs = fastoip.get(key, False), triton.get(key, False)
        group = ("both_pass" if ours and theirs else "triton_only" if theirs else
                 "fastoip_only" if ours else "both_fail")
        groups[group].append(key)
    return groups


def print_comparison(fastoip_json: Path, triton_json: Path) -> int:
    fastoip, triton = load_rows(fastoip_json), load_rows(triton_json)
    suites = {k[0] for k in fastoip} & {k[0] for k in triton}
    groups = compare(fastoip, triton, suites)
    print(f"{'suite':22} {'fastoip':>14} {'triton':>14}")
    for suite in sorted(suites):
        counts = []
        for rows in (fastoip, triton):
            mine = [ok for (s, _), ok in rows.items() if s == suite]
            counts.append(f"{sum(mine)}/{len(mine)}")
        print(f"{suite:22} {counts[0]:>14} {counts[1]:>14}")
    titles = {"triton_only": "Triton passes, fastoip fails (the goal's list)",
              "fastoip_only": "fastoip passes, Triton fails", "both_fail": "both fail"}
    for group, title in titles.items():
        print(f"\n{title}: {len(groups[group])}")
        for suite, case in groups[group]:
            print(f"    {suite}: {case}")
    print(f"\nboth pass: {len(groups['both_pass'])}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("FASTOIP_JSON", "TRITON_JSON"),
                        help="compare two runs' --json files (runs nothing)")
    if "--compare" in (argv if argv is not None else sys.argv[1:]):
        return print_comparison(*parser.parse_known_args(argv)[0].compare)
    parser.add_argument("--snapshot", type=Path, required=True, help="server tree or bare git dir")
    parser.add_argument("--server", choices=("fastoip", "triton"), default="fastoip",
                        help="the server the suites start: fastoip, or real tritonserver as the reference")
    parser.add_argument("--triton-venv", type=Path,
                        default=Path(os.environ.get("PEERS_WORK", Path(__file__).resolve().parent.parent
                                                    / "benchmarks" / ".work")) / "venv-triton",
                        help="the peers lab's venv holding the nvidia-pytriton wheel (--server triton)")
    parser.add_argument("--python-backend", type=Path, help="python_backend tree or bare git dir")
    parser.add_argument("--suite", action="append", choices=SELECTED, help="run only these (repeatable)")
    parser.add_argument("--work", type=Path, help="scratch directory (default: a fresh temporary one, kept)")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per sub-suite")
    parser.add_argument("--json", type=Path, help="write the totals here")
    args = parser.parse_args(argv)

    work = args.work or Path(tempfile.mkdtemp(prefix="triton-qa-"))
    work.mkdir(parents=True, exist_ok=True)
    server = extract_tree(args.snapshot.resolve(), "qa", work / "server")
    qa = work / "qa"
    if qa.exists():
        shutil.rmtree(qa)
    qa.mkdir()
    for part in ("common", "L0_backend_python", "python_models"):
        shutil.copytree(server / "qa" / part, qa / part, symlinks=True)
    backend = None
    if args.python_backend:
        backend = extract_tree(args.python_backend.resolve(), "examples", work / "python_backend")
    triton_dir = work
    # Real Triton's models see the suites' PYTHONPATH less fastoip's sources (fastoip's own pb_utils must not stand
    # in for the stub's).
    model_pythonpath = os.pathsep.join([str(qa / "common"), str(work / "shims")])
    triton = RealTriton(args.triton_venv) if args.server == "triton" else None
    tools = make_shims(triton_dir, backend, triton, model_pythonpath)
    make_data(qa, work / "data")
    l0 = qa / "L0_backend_python"
    adapt_util(qa / "common" / "util.sh")
    src = Path(__file__).resolve().parent.parent / "src"
    env = dict(
        os.environ,
        PATH=f"{tools}:{os.environ['PATH']}",
        PYTHONPATH=os.pathsep.join([str(src), str(qa / "common"), str(tools)]),
        TRITON_DIR=str(triton_dir),
        SERVER=str(triton_dir / "bin" / "tritonserver"),
        BACKEND_DIR=str(triton_dir / "backends"),
        MODELDIR=str(l0),
        DATADIR=str(work / "data"),  # Triton's model data set: only its libtorch/ONNX cases read it
        REPO_VERSION=args.server,
        NVIDIA_TRITON_SERVER_VERSION=args.server,
        PYTHON_ENV_VERSION="12",
        TEST_JETSON="0",
        TEST_WINDOWS="0",
        PYTHON_BACKEND_REPO_TAG="main",
        TRITON_REPO_ORGANIZATION="http://github.com/triton-inference-server",
    )
    # Stopped (SIGTERM), the suite running now and what it started end too (run_suite's finally).
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    results = []
    prefix = private_shm_prefix()
    print("each suite has a private /dev/shm" if prefix else
          "no private /dev/shm (needs root and unshare): the suites' shm page counts see the whole machine's")
    for name in args.suite or SELECTED:
        result = run_suite(name, l0, env, args.timeout, prefix)
        results.append(result)
        print(f"{name:22} exit={result.exit_status:<4} passed={len(result.passed):<4} failed={len(result.failed):<4}"
              f" skipped={len(result.skipped):<3} {result.seconds:6.0f}s", flush=True)
        for case in result.failed:
            print(f"    FAILED {case}", flush=True)
    passed = sum(len(r.passed) for r in results)
    failed = sum(len(r.failed) for r in results)
    print(f"total: {passed} passed, {failed} failed, {sum(len(r.skipped) for r in results)} skipped; outputs in {qa}")
    for name, reason in SKIPPED.items():
        print(f"not run: {name}: {reason}")
    if args.json:
        args.json.write_text(json.dumps({"server": args.server, "suites": [r.__dict__ for r in results],
                                         "cases": case_rows(results)}, indent=1))
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())

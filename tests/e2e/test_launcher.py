"""fastoip.launcher: the one child-process launcher of the tests, the benchmarks and ``fastoip bench``.

Real child processes (small Python scripts standing in for a server), real signals, real /proc.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest

from fastoip.launcher import ChildProcess, LaunchError, parse_cpu_list, process_group_members
from serverproc import wait_until

# Prints its listening lines, then runs until SIGTERM (default action) or forever.
SERVER = """
import sys, time
print("starting", flush=True)
for kind, port in (("grpc", 1234), ("http", 5678)):
    print(f"fake: {kind} listening on 127.0.0.1:{port}", flush=True)
time.sleep(600)
"""


def python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_ports_from_listening_lines_and_output_kept(tmp_path: Path) -> None:
    log = tmp_path / "child.log"
    with ChildProcess(python(SERVER), want=("grpc", "http"), log_path=log) as child:
        assert child.ports == {"grpc": 1234, "http": 5678}
        assert child.alive()
        assert child.output().startswith("starting\n")
        assert child.lines[0] == "starting\n"
    assert child.returncode == -signal.SIGTERM
    assert "fake: http listening on 127.0.0.1:5678" in log.read_text()


def test_exit_before_listening_is_a_launch_error_with_the_output() -> None:
    child = ChildProcess(python("print('bad flag: --nope', flush=True); raise SystemExit(3)"))
    with pytest.raises(LaunchError, match=r"exited with code 3(.|\n)*bad flag: --nope"):
        child.start(timeout=30)
    assert child.returncode == 3


def test_not_listening_in_time_is_a_launch_error_and_the_child_is_stopped() -> None:
    child = ChildProcess(python("import time; print('slow', flush=True); time.sleep(600)"))
    with pytest.raises(LaunchError, match=r"did not listen within 1 s(.|\n)*slow"):
        child.start(timeout=1)
    assert not child.alive()


def test_sigterm_then_sigkill_for_a_child_that_ignores_sigterm() -> None:
    code = (
        "import signal, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "print('x: grpc listening on 127.0.0.1:1', flush=True)\n"
        "time.sleep(600)\n"
    )
    child = ChildProcess(python(code)).start(timeout=30)
    assert child.stop(timeout=0.5) == -signal.SIGKILL


def test_first_signal_is_configurable() -> None:
    code = (
        "import time\n"
        "try:  # from before the listening line: the SIGINT may come as soon as it is out\n"
        "    print('x: grpc listening on 127.0.0.1:1', flush=True)\n"
        "    time.sleep(600)\n"
        "except KeyboardInterrupt:\n"
        "    print('interrupted', flush=True)\n"
        "    raise SystemExit(7)\n"
    )
    child = ChildProcess(python(code)).start(timeout=30)
    assert child.stop(timeout=20, first_signal=signal.SIGINT) == 7
    assert "interrupted" in child.output()


def test_group_stop_reaches_what_the_child_started() -> None:
    # The child starts a grandchild that survives the child's SIGTERM; only a group stop reaches it.
    code = (
        "import subprocess, sys, time\n"
        "g = subprocess.Popen([sys.executable, '-c', 'import signal, time; "
        "signal.signal(signal.SIGTERM, signal.SIG_IGN); print(1, flush=True); time.sleep(600)'], "
        "stdout=subprocess.PIPE)\n"
        "g.stdout.readline()  # it ignores SIGTERM from here on\n"
        "print(f'grandchild {g.pid}', flush=True)\n"
        "print('x: grpc listening on 127.0.0.1:1', flush=True)\n"
        "time.sleep(600)\n"
    )
    child = ChildProcess(python(code)).start(timeout=30)
    grandchild = int(child.output().split("grandchild ")[1].split()[0])
    assert grandchild in child.group_pids() and child.pid in child.group_pids()
    assert os.getpgid(child.pid) == child.pid  # a session of its own
    child.stop(timeout=5, group=True)  # SIGTERM to the child, to the group (ignored), then SIGKILL to the group
    assert process_group_members(child.pid) == []


def test_pinned_to_the_cpus_asked_for() -> None:
    allowed = sorted(os.sched_getaffinity(0))
    child = ChildProcess(python(SERVER), cpus={allowed[-1]}).start(timeout=30)
    try:
        assert os.sched_getaffinity(child.pid) == {allowed[-1]}
    finally:
        child.stop()


def test_no_want_returns_at_once_and_keep_lines_bounds_the_output() -> None:
    code = "for i in range(1000): print(i, flush=True)\n"
    child = ChildProcess(python(code), want=(), keep_lines=10).start()
    assert child.wait(30) == 0
    wait_until(lambda: "999\n" in child.lines, timeout=10)
    assert child.lines[-1] == "999\n" and 10 <= len(child.lines) <= 20
    assert child.output(3) == "997\n998\n999\n"
    child.stop()


def test_parse_cpu_list() -> None:
    assert parse_cpu_list("0") == {0}
    assert parse_cpu_list("0,2") == {0, 2}
    assert parse_cpu_list("0-3,6") == {0, 1, 2, 3, 6}
    assert parse_cpu_list("") == set()


def test_the_output_is_read_to_its_end_after_the_child_exits() -> None:
    """A line a grandchild writes after the child exited (a server's worker finalizing) is captured once
    ``wait_output_end`` returns; ``wait`` alone may return before the pipe is read."""
    script = ("import subprocess, sys; subprocess.Popen([sys.executable, '-c', "
              "'import time; time.sleep(0.3); print(\"late line\", flush=True)']); print('early', flush=True)")
    child = ChildProcess([sys.executable, "-c", script]).spawn()
    assert child.wait(10) == 0
    assert child.wait_output_end(10)
    assert child.output() == "early\nlate line\n"

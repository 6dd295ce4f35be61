#!/usr/bin/env python3
"""Check the module import graph of ``src/fastoip``: no cycles, no imports from a lower layer up.

Usage: ``python scripts/import_graph.py [--show]`` (exit status 1 when a rule is broken).

The graph is built with :mod:`ast`, without importing anything: every ``import``
and ``from ... import`` counts, at module level or inside a function, under
``if TYPE_CHECKING:`` too (a type-only arrow up is still an arrow up).  A
``from package import name`` points at ``package.name`` when that is a module.

Layers, lowest first; a module may import its own layer and the layers below it:

0. ground: the vocabulary every layer shares (types, errors, datatypes,
   options, settings, the generated protobuf modules, CUDA helpers,
   statistics, tracing, model configs, classification, content types, the Python model API);
1. wire: where tensor bytes come from and go: the codecs (``_codec``,
   ``wire/``), the shared-memory regions and a Python model's worker process
   (``pyworker/``: its tensors cross through shared memory and the codec);
2. models: ``repository/``, ``scheduling/``, ``backends/``, the response cache and output finishing;
3. core: ``core/`` and ``testing`` (an in-process client on the Core);
4. top: frontends (``server/``), ``bench/``, the CLI and its Triton flags, the demo repository, ``embed``.

The Core does not import ``backends/`` (a backend registers what the Core must reach with the Core's link,
``fastoip.core_link``: the seam both import), though it sits above them.

One more rule for the frontends (``server/grpc/``, ``server/http/``: the translators): they reach the models
only through the Core.  They import the Core, the wire layer and the ground floor, never ``repository/``,
``scheduling/`` (the scheduler's ``Job``), ``backends/`` or the models layer's other modules.  ``server/app.py``
is the assembly, not a translator: it may build what the Core is given (a remote repository's copy).
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "src"
PACKAGE = "fastoip"

#: Module name prefixes (after ``fastoip.``) -> layer; the longest matching prefix wins.
LAYERS: dict[str, int] = {
    "": 0,  # fastoip/__init__.py (version, lazy public API)
    "types": 0,
    "errors": 0,
    "datatypes": 0,
    "options": 0,
    "settings": 0,
    "_proto": 0,
    "cuda": 0,
    "metrics": 0,
    "metric_names": 0,  # standard library only: Prometheus' name rules (the worker checks a model's metrics too)
    "content_types": 0,
    "model": 0,
    "lifecycle": 0,
    "classification": 0,
    "host_metrics": 0,
    "allocator": 0,  # standard library only: the serve process's malloc setting
    "tracing": 0,
    "model_config": 0,  # config.pbtxt in every form and the precomputed ModelSpec (backends and repository read it)
    "model_settings": 0,  # MLServer's model-settings.json, validated (model_config reads it)
    "core_link": 0,  # the seam between a Core and its backends (both import it; the Core never imports backends/)
    "pyworker": 1,  # a Python model's worker process: standard library, numpy and the codec's C (its small tensors)
    "_codec": 1,
    "wire": 1,
    "shared_memory": 1,
    "_shmguard": 1,
    "repository": 2,
    "scheduling": 2,
    "backends": 2,
    "response_outputs": 2,
    "response_cache": 2,
    "core": 3,
    "testing": 3,  # an in-process client on the Core, for users' tests
    "server": 4,
    "bench": 4,
    "cli": 4,
    "triton_flags": 4,
    "serve_help": 4,  # arranges `serve --help` (groups, defaults, preferred spellings)
    "demo": 4,
    "mlserver_start": 4,  # `fastoip mlserver start`: MLServer's settings as serve flags
    "demo_openai": 4,  # the OpenAI examples of the demo repository
    "embed": 4,  # fastoip.Server: the server app inside the caller's process
    "__main__": 4,
    "launcher": 0,  # standard library only: starts fastoip children for tests, benchmarks and bench
    "health_check": 0,  # standard library only: `fastoip health`, a client of any V2 server's HTTP API
}
LAYER_NAMES = ("ground", "wire", "models", "core", "top")

#: Module prefixes (after ``fastoip.``) that are frontends: they may not import the models layer at all.
FRONTENDS = ("server.grpc", "server.http")
MODELS = LAYER_NAMES.index("models")
#: (importer prefix, imported prefix) pairs that are refused whatever their layers: the Core reaches the backends
#: only through what they register with its link (``core_link``).
FORBIDDEN: tuple[tuple[str, str], ...] = (("core", "backends"),)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def layer_of(module: str) -> int:
    rest = module[len(PACKAGE) + 1 :] if module != PACKAGE else ""
    parts = rest.split(".") if rest else []
    if not parts:
        return LAYERS[""]
    for end in range(len(parts), 0, -1):
        prefix = ".".join(parts[:end])
        if prefix in LAYERS:
            return LAYERS[prefix]
    raise SystemExit(f"import_graph: module {module} has no layer; add it to LAYERS")


def imports_of(path: Path, module: str, modules: set[str]) -> set[str]:
    """The fastoip modules that ``module`` (the file at ``path``) imports."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                origin = ".".join(base + ([node.module] if node.module else []))
            else:
                origin = node.module or ""
            targets = [
                f"{origin}.{alias.name}" if f"{origin}.{alias.name}" in modules else origin for alias in node.names
            ]
        else:
            continue
        for target in targets:
            # "import a.b.c" of a module we own, or of something inside it
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != module:
                found.add(target)
    return found


def build_graph() -> dict[str, set[str]]:
    files = {module_name(p): p for p in (ROOT / PACKAGE).rglob("*.py")}
    for pyx in (ROOT / PACKAGE).rglob("*.pyx"):  # the Cython codec is a module others import
        files.setdefault(module_name(pyx), pyx)
    modules = set(files)
    return {m: (imports_of(p, m, modules) if p.suffix == ".py" else set()) for m, p in files.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component with more than one module (Tarjan), as sorted lists."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(node: str) -> None:
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(10000)
    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def upward(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    return sorted((a, b) for a, targets in graph.items() for b in targets if layer_of(b) > layer_of(a))


def is_frontend(module: str) -> bool:
    rest = module[len(PACKAGE) + 1 :]
    return any(rest == prefix or rest.startswith(prefix + ".") for prefix in FRONTENDS)


def past_the_core(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Frontend imports of the models layer (a frontend reaches models through the Core only)."""
    return sorted(
        (a, b) for a, targets in graph.items() if is_frontend(a) for b in targets if layer_of(b) == MODELS
    )


def under(module: str, prefix: str) -> bool:
    rest = module[len(PACKAGE) + 1 :]
    return rest == prefix or rest.startswith(prefix + ".")


def forbidden(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Imports :data:`FORBIDDEN` names (the Core importing a backend)."""
    return sorted(
        (a, b)
        for a, targets in graph.items()
        for b in targets
        for importer, imported in FORBIDDEN
        if under(a, importer) and under(b, imported)
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--show", action="store_true", help="print every module with its layer and imports")
    args = parser.parse_args()
    graph = build_graph()
    if args.show:
        for module in sorted(graph):
            print(f"{LAYER_NAMES[layer_of(module)]:>6}  {module} -> {', '.join(sorted(graph[module])) or '-'}")
    problems = 0
    for component in cycles(graph):
        problems += 1
        print("cycle: " + " <-> ".join(component))
    for source, target in upward(graph):
        problems += 1
        print(
            f"upward import: {source} ({LAYER_NAMES[layer_of(source)]}) imports "
            f"{target} ({LAYER_NAMES[layer_of(target)]})"
        )
    for source, target in past_the_core(graph):
        problems += 1
        print(f"frontend past the Core: {source} imports {target} (models); go through fastoip.core")
    for source, target in forbidden(graph):
        problems += 1
        print(f"forbidden import: {source} imports {target}; the Core reaches backends through fastoip.core_link")
    edges = sum(len(t) for t in graph.values())
    print(f"import_graph: {len(graph)} modules, {edges} imports, {problems} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

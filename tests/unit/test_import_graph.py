"""scripts/import_graph.py's layer rules (issue 36): the Core does not import ``backends/``; the backends reach
it, and leave with it what it must reach, through ``fastoip.core_link``."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "import_graph.py"


def _checker() -> ModuleType:
    spec = importlib.util.spec_from_file_location("import_graph", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["import_graph"] = module
    spec.loader.exec_module(module)
    return module


def test_the_core_imports_no_backend() -> None:
    checker = _checker()
    graph = checker.build_graph()
    assert checker.forbidden(graph) == []
    core_imports = {target for module, targets in graph.items() if module.startswith("fastoip.core.")
                    for target in targets}
    assert "fastoip.core_link" in core_imports
    assert not [target for target in core_imports if target.startswith("fastoip.backends")]
    assert checker.upward(graph) == [] and checker.cycles(graph) == []


def test_a_core_module_importing_a_backend_is_reported() -> None:
    """The Core sits above the backends (an import down is allowed by layers), but this one is refused."""
    checker = _checker()
    graph = {
        "fastoip.core.core": {"fastoip.backends.python.triton.server_bridge", "fastoip.scheduling.job"},
        "fastoip.backends.python.triton.server_bridge": {"fastoip.core_link"},
        "fastoip.scheduling.job": set(),
        "fastoip.core_link": set(),
    }
    assert checker.forbidden(graph) == [("fastoip.core.core", "fastoip.backends.python.triton.server_bridge")]
    assert checker.upward(graph) == []  # layers alone let it through

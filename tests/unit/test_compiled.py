"""The per-call path compiled by mypyc (setup.py's ``COMPILED_PY``): what the build made is what the list says.

Where the compiled modules were not built (``FASTOIP_PURE_PYTHON=1``, as ``make debug`` builds) the interpreted
modules run and these tests skip.
"""

from __future__ import annotations

import importlib
import importlib.util

import pytest

from compiled import REPO, compiled_sources

BUILT = importlib.util.find_spec("fastoip._percall__mypyc") is not None
needs_build = pytest.mark.skipif(not BUILT, reason="the per-call path's compiled modules are not built")


def module_name(path: object) -> str:
    relative = str(path).removeprefix(str(REPO / "src") + "/")
    return relative.removesuffix(".py").replace("/", ".")


def test_the_list_names_existing_sources_once() -> None:
    sources = compiled_sources()
    assert sources and len(set(sources)) == len(sources)
    assert all(path.is_file() and path.suffix == ".py" for path in sources)


@needs_build
def test_every_listed_module_imports_compiled() -> None:
    for source in compiled_sources():
        module = importlib.import_module(module_name(source))
        assert module.__file__ is not None and module.__file__.endswith(".so"), module.__file__


@needs_build
def test_a_compiled_module_still_reports_its_source_lines() -> None:
    """A traceback through compiled code names the .py file and line, as the interpreted module would."""
    from fastoip.server.grpc import native_head

    with pytest.raises(TypeError) as caught:
        native_head.read_head(None, {})  # type: ignore[arg-type]
    frames = [(entry.path.name, entry.lineno) for entry in caught.traceback]
    assert any(name == "native_head.py" for name, _ in frames), frames

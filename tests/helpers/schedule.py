"""The order ``make test`` hands modules to its workers: the longest first.

``make test`` runs ``pytest -n 4 --dist loadfile``: a module and its servers stay on one worker, so a long module
that starts late is the run's tail.  pytest-xdist, left alone, orders modules by their number of tests, which puts
the longest ones (the packaging test: 3 tests, about 100 s; the README blocks: 4 tests, about 100 s) last.  The
suite therefore hands out modules longest first (LPT scheduling), by the seconds each took in a recent run.

Refresh the table after a module's time changes much: ``pytest -n 4 --dist loadfile --junitxml=run.xml`` and sum
each module's test times.  A module not in it is estimated from its number of tests.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

# Seconds per module (setup + call + teardown of its tests), measured 2026-11-27 with -n 4 on the shared
# 2-vCPU machine: only the order matters, not the figures.
MODULE_SECONDS: dict[str, float] = {
    "e2e/test_packaging.py": 116,
    "e2e/test_readme.py": 99,
    "e2e/test_gpu_bench.py": 70,  # (issue 42 added its graph part and the cores dry run: ~74 s with -n 2 here)
    "e2e/test_grpc_clients.py": 65,
    "e2e/test_bench.py": 43,
    "e2e/test_grpc_abuse.py": 37,
    "e2e/test_triton_python_backend.py": 34,
    "e2e/test_lifecycle.py": 32,
    "e2e/test_isolated_suites.py": 32,
    "e2e/test_inflate.py": 31,
    "unit/test_codec_fuzz.py": 31,
    "e2e/test_drop_in.py": 31,
    "e2e/test_examples.py": 26,
    "e2e/test_grpc_native.py": 22,
    "e2e/test_bench_tls.py": 21,
    "e2e/test_batcher.py": 20,
    "e2e/test_http_json_pool.py": 18,
    "e2e/test_bytes_limit.py": 17,
    "e2e/test_metrics_http.py": 16,
    "e2e/test_shared_memory_safety.py": 16,
    "e2e/test_stream_budget.py": 15,
    "e2e/test_bench_perf_analyzer.py": 14,
    "e2e/test_http_limits.py": 14,
    "e2e/test_sequence_abandoned.py": 14,
    "e2e/test_bench_native_client.py": 13,
    "e2e/test_http.py": 13,
    "e2e/test_cuda_plumbing.py": 13,
    "e2e/test_first_hour.py": 30,  # 2026-12-06: the health, signal-during-a-load and 80 MB body tests
    "e2e/test_docs_browser.py": 20,  # 2026-12-06: Chromium started once, two page loads
    "e2e/test_grpc.py": 12,
    "e2e/test_metrics.py": 12,
    "e2e/test_grpc_streams.py": 10,
    "e2e/test_triton_flags.py": 10,
    "e2e/test_tracing_server.py": 10,
    "e2e/test_grpc_native_options.py": 9,
    "e2e/test_grpc_connection_limits.py": 9,
    "e2e/test_grpc_shutdown.py": 9,
    "e2e/test_http_connection_limits.py": 9,
    "e2e/test_http_tritonclient.py": 8,
    "e2e/test_reload_memory.py": 8,
    "e2e/test_launcher.py": 8,
    "e2e/test_remote_repository.py": 7,
    "e2e/test_grpc_intake.py": 7,
    "e2e/test_triton_examples.py": 7,
    "e2e/test_restricted.py": 7,
    "e2e/test_http_body_rate.py": 6,
    "e2e/test_shared_memory.py": 6,
    "e2e/test_grpc_idle_streams.py": 6,
}
# a module outside the table: a server start and a tenth of a second a test (about the mean of the short modules)
UNLISTED_BASE_SECONDS = 1.0
UNLISTED_SECONDS_PER_TEST = 0.1


def module_key(item: pytest.Item, tests_root: Path) -> str:
    """``e2e/test_x.py`` for a test in tests/e2e/test_x.py (the table's key)."""
    try:
        return item.path.relative_to(tests_root).as_posix()
    except ValueError:
        return item.path.as_posix()


def longest_modules_first(items: list[pytest.Item], tests_root: Path) -> None:
    """Reorder ``items`` in place: modules by their expected seconds, longest first; within a module, unchanged."""
    per_module = Counter(module_key(item, tests_root) for item in items)

    def seconds(module: str) -> float:
        known = MODULE_SECONDS.get(module)
        return known if known is not None else UNLISTED_BASE_SECONDS + UNLISTED_SECONDS_PER_TEST * per_module[module]

    expected = {module: seconds(module) for module in per_module}
    first_seen: dict[str, int] = {}
    for index, item in enumerate(items):
        first_seen.setdefault(module_key(item, tests_root), index)

    def position(pair: tuple[int, pytest.Item]) -> tuple[float, int, int]:
        # by module, then by original position: a module's tests stay together and in their order
        module = module_key(pair[1], tests_root)
        return -expected[module], first_seen[module], pair[0]

    items[:] = [item for _, item in sorted(enumerate(items), key=position)]

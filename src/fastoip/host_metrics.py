"""Host metrics under Triton's names: CPU from /proc, GPUs through NVML when there are any.

Rules:
- ``nv_cpu_utilization`` is the share of non-idle CPU time between two scrapes
  (Triton samples every 2 s; here each scrape closes one interval), read from
  /proc/stat's aggregate line; memory is /proc/meminfo's MemTotal and
  MemTotal - MemAvailable, Triton's definition of "used".
- GPU families exist only when ``nvidia-ml-py`` (the ``fastoip[gpu]`` extra) is
  installed and NVML finds a device: a CPU host exports none, as Triton's CPU build.
- Where /proc is missing (not Linux), the CPU families are left out, not faked.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

from prometheus_client.metrics_core import Metric

log = logging.getLogger("fastoip.metrics")

CPU_NAMES = frozenset({"nv_cpu_utilization", "nv_cpu_memory_total_bytes", "nv_cpu_memory_used_bytes"})
PINNED_NAMES = frozenset({"nv_pinned_memory_pool_total_bytes", "nv_pinned_memory_pool_used_bytes"})
GPU_NAMES = frozenset({
    "nv_gpu_utilization", "nv_gpu_memory_total_bytes", "nv_gpu_memory_used_bytes", "nv_gpu_power_usage",
    "nv_gpu_power_limit", "nv_energy_consumption",
})


def read_cpu_times(path: Path = Path("/proc/stat")) -> tuple[int, int]:
    """(busy, idle) jiffies of all CPUs: busy = user+nice+system+irq+softirq+steal, idle = idle+iowait."""
    with path.open() as f:
        first = f.readline().split()
    if not first or first[0] != "cpu":
        raise ValueError(f"{path}: no aggregate 'cpu' line")
    user, nice, system, idle, iowait, irq, softirq, steal = (int(v) for v in (first[1:9] + ["0"] * 8)[:8])
    return user + nice + system + irq + softirq + steal, idle + iowait


def read_memory(path: Path = Path("/proc/meminfo")) -> tuple[int, int]:
    """(total, used) bytes, used = MemTotal - MemAvailable."""
    info = {}
    with path.open() as f:
        for line in f:
            name, _, rest = line.partition(":")
            fields = rest.split()
            if fields:
                info[name] = int(fields[0]) * 1024
    total, available = info["MemTotal"], info["MemAvailable"]
    return total, total - available


class CpuCollector:
    """``nv_cpu_*`` gauges; utilization over the time since the previous scrape."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        try:
            self._last: tuple[int, int] | None = read_cpu_times()
        except (OSError, ValueError):
            self._last = None

    def collect(self) -> list[Metric]:
        if self._last is None:
            return []
        try:
            busy, idle = read_cpu_times()
            total, used = read_memory()
        except (OSError, ValueError, KeyError):
            return []
        with self._lock:
            last_busy, last_idle = self._last
            self._last = (busy, idle)
        busy_diff, idle_diff = max(0, busy - last_busy), max(0, idle - last_idle)
        utilization = busy_diff / (busy_diff + idle_diff) if busy_diff + idle_diff else 0.0
        return [
            _gauge("nv_cpu_utilization", "CPU utilization rate [0.0 - 1.0]", utilization),
            _gauge("nv_cpu_memory_total_bytes", "CPU total memory (RAM), in bytes", total),
            _gauge("nv_cpu_memory_used_bytes", "CPU used memory (RAM), in bytes", used),
        ]


class GpuCollector:
    """``nv_gpu_*`` gauges per device (label ``gpu_uuid``, as Triton), through NVML."""

    def __init__(self, nvml: Any, handles: list[Any]) -> None:
        self._nvml = nvml
        self._devices = [(handle, _text(nvml.nvmlDeviceGetUUID(handle))) for handle in handles]
        self._energy_start = {uuid: self._energy_mj(handle) for handle, uuid in self._devices}

    @classmethod
    def create(cls) -> GpuCollector | None:
        """A collector when NVML is installed and sees a GPU; None otherwise (no GPU families at all)."""
        try:
            import pynvml  # nvidia-ml-py, the fastoip[gpu] extra
        except ImportError:
            return None
        try:
            pynvml.nvmlInit()
            handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        except pynvml.NVMLError as exc:
            log.info("no GPU metrics: %s", exc)
            return None
        return cls(pynvml, handles) if handles else None

    def _energy_mj(self, handle: Any) -> int | None:
        try:
            return int(self._nvml.nvmlDeviceGetTotalEnergyConsumption(handle))
        except self._nvml.NVMLError:  # older GPUs have no energy counter
            return None

    def collect(self) -> list[Metric]:
        nvml = self._nvml
        families = {
            "nv_gpu_utilization": Metric("nv_gpu_utilization", "GPU utilization rate [0.0 - 1.0)", "gauge"),
            "nv_gpu_memory_total_bytes": Metric("nv_gpu_memory_total_bytes", "GPU total memory, in bytes", "gauge"),
            "nv_gpu_memory_used_bytes": Metric("nv_gpu_memory_used_bytes", "GPU used memory, in bytes", "gauge"),
            "nv_gpu_power_usage": Metric("nv_gpu_power_usage", "GPU power usage in watts", "gauge"),
            "nv_gpu_power_limit": Metric("nv_gpu_power_limit", "GPU power management limit in watts", "gauge"),
            "nv_energy_consumption": Metric(
                "nv_energy_consumption", "GPU energy consumption in joules since the Triton Server started", "counter"
            ),
        }
        for handle, uuid in self._devices:
            labels = {"gpu_uuid": uuid}
            readings: list[tuple[str, Any]] = [
                ("nv_gpu_utilization", lambda h: nvml.nvmlDeviceGetUtilizationRates(h).gpu / 100.0),
                ("nv_gpu_memory_total_bytes", lambda h: nvml.nvmlDeviceGetMemoryInfo(h).total),
                ("nv_gpu_memory_used_bytes", lambda h: nvml.nvmlDeviceGetMemoryInfo(h).used),
                ("nv_gpu_power_usage", lambda h: nvml.nvmlDeviceGetPowerUsage(h) / 1000.0),
                ("nv_gpu_power_limit", lambda h: nvml.nvmlDeviceGetPowerManagementLimit(h) / 1000.0),
            ]
            for name, read in readings:
                try:
                    families[name].add_sample(name, labels, read(handle))
                except nvml.NVMLError:  # a reading this device does not support is left out
                    pass
            start, now = self._energy_start.get(uuid), self._energy_mj(handle)
            if start is not None and now is not None:
                families["nv_energy_consumption"].add_sample("nv_energy_consumption", labels, (now - start) / 1000.0)
        return [family for family in families.values() if family.samples]


class HostMetrics:
    """CPU and (where present) GPU families, read at scrape time."""

    def __init__(self) -> None:
        self.cpu = CpuCollector()
        self.gpu = GpuCollector.create()

    def collect(self) -> list[Metric]:
        return self.cpu.collect() + pinned_pool_metrics() + (self.gpu.collect() if self.gpu is not None else [])


def pinned_pool_metrics() -> list[Metric]:
    """Triton's ``nv_pinned_memory_pool_*`` gauges: the pool's size and the pinned bytes batches hold now."""
    from .cuda import pinned_pool  # the module loads no CUDA library on import

    return [
        _gauge("nv_pinned_memory_pool_total_bytes", "Pinned memory pool total memory size, in bytes",
               pinned_pool.total),
        _gauge("nv_pinned_memory_pool_used_bytes", "Pinned memory pool used memory size, in bytes", pinned_pool.used),
    ]


def _gauge(name: str, help_text: str, value: float) -> Metric:
    family = Metric(name, help_text, "gauge")
    family.add_sample(name, {}, value)
    return family


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)

"""The seam between a Core and the backends it loads: what a backend reaches in the Core, and what it leaves there.

Rules:
- The Core never imports ``backends/`` (``scripts/import_graph.py`` checks it); the backends never import the
  Core.  Both import this module.  Each Core makes one :class:`CoreLink` before its repository (the repository's
  options carry it to every backend they load: ``RepositoryOptions.server_link``) and attaches itself when built.
- A backend reaches the Core through :attr:`CoreLink.core` (:class:`CoreAccess`: the verbs a model's calls
  need, e.g. Triton's BLS) and builds its call contexts with :attr:`CoreLink.call_type` (the Core's
  ``CallContext``).
- A backend leaves with the link what the Core must reach without knowing the backend: its per-Core state
  (:meth:`CoreLink.state`), what ends its processes when the server's shutdown ran past its exit timeout
  (:meth:`CoreLink.on_end`), and its models' own metric families (:attr:`CoreLink.custom_metrics`, exported on
  ``/metrics`` after the server's).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from .metrics.custom import CustomMetrics
from .types import InferRequest, InferResponse

T = TypeVar("T")


class CoreAccess(Protocol):
    """What a backend's models may call on the Core that loaded them."""

    def infer(self, request: InferRequest, call: Any = None) -> InferResponse: ...

    def start(
        self,
        request: InferRequest,
        call: Any,
        on_done: Callable[[Any], object],
        on_response: Callable[[Any, InferResponse], object] | None = None,
    ) -> Any: ...

    def model_ready(self, name: str, version: str = "") -> bool: ...

    def load_model(self, name: str, parameters: dict[str, Any] | None = None) -> None: ...

    def unload_model(self, name: str) -> None: ...


class CoreLink:
    """One Core as its backends see it (made before the Core; see the module's rules)."""

    def __init__(self) -> None:
        #: The Core, once attached (None: a repository built outside a Core; its models' calls fail clearly).
        self.core: CoreAccess | None = None
        #: The Core's ``CallContext`` class (the backends never import the Core).
        self.call_type: Callable[..., Any] | None = None
        #: The metric families the models of this Core define.
        self.custom_metrics = CustomMetrics()
        #: Set by :meth:`end_backends`: nothing a backend ends comes back.
        self.stopping = False
        self._lock = threading.RLock()  # (a state's maker may register an ender)
        self._states: dict[str, Any] = {}
        self._enders: list[Callable[[], int]] = []

    def attach(self, core: CoreAccess, call_type: Callable[..., Any]) -> None:
        self.core = core
        self.call_type = call_type

    def state(self, key: str, make: Callable[[], T]) -> T:
        """A backend's own state for this Core, made by ``make()`` the first time ``key`` is asked for."""
        with self._lock:
            value = self._states.get(key)
            if value is None:
                value = self._states[key] = make()
            return value

    def on_end(self, ender: Callable[[], int]) -> None:
        """``ender()`` kills what a backend runs outside the server's threads (worker processes) when the
        shutdown ran past its exit timeout, and says how many it ended."""
        with self._lock:
            self._enders.append(ender)

    def end_backends(self) -> int:
        """Run every backend's ender (the server's shutdown ran past ``--exit-timeout``): how many processes
        were ended."""
        self.stopping = True
        with self._lock:
            enders = list(self._enders)
        return sum(ender() for ender in enders)

"""A Triton Python model's own ``is_ready()``, asked as python_backend asks it (newer than Triton 2.51).

Rules (python_be.cc's ``RunUserModelReadinessCheck`` and ``TRITONBACKEND_ModelInstanceReady``):
- A model without ``is_ready`` is ready, and is not asked again (no message per readiness request).
- One check at a time per instance: a readiness request that comes while one is on its way waits for it (at
  most :data:`TIMEOUT_S`) and takes its answer; it starts no second one.
- The asker waits at most :data:`TIMEOUT_S`: past it the instance is not ready for that request (UNAVAILABLE
  "Timed out waiting for user-defined is_ready() response"), while the check goes on in the background; the
  requests that come meanwhile wait for it, as above, and take its answer.
- ``False`` is not ready ("Model '<instance>' is not ready (user-defined check failed)."); an exception, or an
  answer that is not a bool, is not ready with the model's error.  Each reason is logged (Triton's core logs
  "Model '<m>' version <v> is not ready: <reason>" for each readiness request that finds it).
- Inference does not depend on it: a model whose ``is_ready()`` says False is still served.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger("fastoip.python")

#: python_backend's ``kUserModelReadinessTimeoutMs``.
TIMEOUT_S = 5.0

#: ``ask()`` -> ``(defined, ready, error)``: the model's answer (blocking; raises when the model is gone).
Ask = Callable[[], "tuple[bool, bool, str | None]"]


class UserReadiness:
    """The ``is_ready()`` of one instance; :meth:`reason` asks it (or shares the check on its way)."""

    def __init__(self, ask: Ask, model: str, version: str, instance: str, timeout: float = TIMEOUT_S) -> None:
        self._ask = ask
        self._model = model
        self._version = version
        self._instance = instance
        self._timeout = timeout
        self._cond = threading.Condition()
        #: None until the first answer says whether the model has ``is_ready`` at all.
        self._defined: bool | None = None
        self._in_flight = False
        #: The last check's reason for not ready ("" when ready).
        self._last = ""

    def may_wait(self) -> bool:
        """Whether :meth:`reason` may wait on the model: until its first answer says it has no ``is_ready``."""
        return self._defined is not False

    def reason(self) -> str:
        """"" when the model says it is ready (or has no ``is_ready``), else why not (logged)."""
        with self._cond:
            if self._defined is False:
                return ""
            if not self._in_flight:
                self._in_flight = True
                threading.Thread(target=self._check, name=f"fastoip-is-ready-{self._instance}", daemon=True).start()
            if self._cond.wait_for(lambda: not self._in_flight, self._timeout):
                why = self._last
            else:
                why = "Timed out waiting for user-defined is_ready() response"
        if why:
            log.warning("Model '%s' version %s is not ready: %s", self._model, self._version, why)
        return why

    def _check(self) -> None:
        """One check (its own thread: it may outlive the request that started it, as the stub's does)."""
        try:
            defined, ready, error = self._ask()
            if error is not None:
                why = error
            elif ready:
                why = ""
            else:
                why = f"Model '{self._instance}' is not ready (user-defined check failed)."
        except Exception as exc:  # the worker is gone (its death is handled where it is noticed)
            defined, why = True, f"Stub process '{self._instance}' is not healthy ({exc})"
        with self._cond:
            self._defined = defined
            self._last = why
            self._in_flight = False
            self._cond.notify_all()

"""Python backend: custom models written as ``fastoip.Model`` subclasses, and Triton's ``TritonPythonModel``.

Layout: ``<repository>/<model>/<version>/model.py`` plus either Triton's
``<model>/config.pbtxt`` (``backend: "python"``) or MLServer's
``<model>/model-settings.json`` (converted by :func:`read_model_settings`).

Rules:
- ``model.py`` is imported once per file version (re-imported when the file
  changes and the model is loaded again), with its version directory on
  ``sys.path`` while it imports.  The class is the one named by the config
  parameter ``implementation`` (a class name in model.py, or
  ``module.Class``), else the only ``fastoip.Model`` subclass model.py defines
  that no other class there derives from.
- ``@on_deployment`` hooks run once per server process, before any instance
  of any model is built: ``prepare`` (called by the repository for every
  model before the first load) runs them; ``load`` runs those not run yet.
- Per instance (``instance_group { count }``): ``__init__``, ``load()``, the
  ``@on_startup`` hooks; at unload or server stop, after the requests in
  flight on it have finished: the ``@on_shutdown`` hooks (reverse order),
  then ``unload()``.  Anything raising during a load fails the whole load
  (instances already started are shut down again); the repository then
  marks the model UNAVAILABLE with the reason.
- Sync methods run on the thread that executes the request (a scheduler or
  gRPC worker thread); ``async def`` methods run on ONE event loop thread
  shared by every Python model, and the calling thread waits for them.
- Schedulers see each instance as ``max_concurrency`` lanes (config
  parameter, default 1): the number of requests that may run on one model
  object at a time (more than 1 is for async models).
- Requests reach the model whole (a ``Backend`` of its own, ``scheduling/contract.py``): the content types of
  the request and of each input decide what ``predict`` gets, and outputs
  carry their content type back (see :mod:`fastoip.content_types`).  When
  the model is batchable, jobs merged by the dynamic batcher that agree on
  parameters and content types go to one ``predict`` call; others run one
  by one.
- A decoupled model (``model_transaction_policy { decoupled: true }``) runs
  one ``predict`` per request; each value its generator (or async generator)
  yields is encoded and sent at once through the job's response sink.

Arranged by API, then by hosting (issue 36).  Here: ``kind`` (the backend kind: which API a model.py
speaks, its config and instances), ``event_loop`` (the loop async model code runs on) and ``describe``.

- ``native/``: fastoip's own ``fastoip.Model``, in process: ``model_file`` (importing model.py, finding its
  class), ``deployment`` (``@on_deployment`` hooks), ``host`` (one model object: lifecycle, health, running
  jobs), ``payloads`` (requests to ``predict`` arguments, its return value to responses), ``decoupled`` (a
  decoupled model's generator stepped into responses).
- ``triton/``: Triton's ``TritonPythonModel`` (a model.py that defines it): ``kind`` (config, auto-complete,
  instances), ``instances`` (instances as scheduler backends: worker processes or in-process),
  ``server_bridge`` (BLS, model control and custom metrics for model code, through the Core's ``core_link``).
- ``mlserver/``: MLServer's ``mlserver.MLModel``: ``runtime`` (a runtime wrapped as a ``fastoip.Model``, in
  process: the class attributes ``payload_codec``, ``one_request_per_call`` and ``streams_only`` are the hooks
  ``native/host``/``kind`` read), ``process`` (such a runtime in worker processes instead, model-settings
  ``fastoip_hosting: "process"``).
- ``hosting/``: a worker process's server side, whatever its API: ``worker_process`` (the server's handle on
  one worker: its channel) and ``exits`` (its exit, noticed by a pidfd); what runs inside a worker is
  :mod:`fastoip.pyworker`.
"""

from __future__ import annotations

from .event_loop import EVENT_LOOP, call
from .kind import KIND, PythonKind
from .native.host import PythonInstance
from .native.payloads import SCHEDULER_PARAMETERS

__all__ = ["EVENT_LOOP", "KIND", "SCHEDULER_PARAMETERS", "PythonInstance", "PythonKind", "call"]

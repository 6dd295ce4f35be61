"""What runs inside a Python model's worker process (and, for in-process hosting, in the server).

Standard library and numpy only, so that a worker imports what its model
needs and nothing of the server: ``utils`` (``triton_python_backend_utils``),
``runner`` (a ``TritonPythonModel`` and its lifecycle on plain data),
``transport`` (tensors through shared memory), ``loop`` (the event loop async
model code runs on), ``mlserver_runner`` (an MLServer runtime in a worker, and
the request/response conversions both its hostings share) and ``worker`` (the
process's main loop).
"""

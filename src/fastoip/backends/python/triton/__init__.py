"""Triton's ``TritonPythonModel``: config, instances (in a worker process or in process), the server bridge."""

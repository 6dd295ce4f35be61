"""MLServer runtimes (``mlserver.MLModel``): in process, or in worker processes."""

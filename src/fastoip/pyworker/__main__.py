"""``python -m fastoip.pyworker FD``: a Python model's worker process (:func:`.worker.main`).

A launcher of its own: ``worker`` is compiled (``setup.py``'s ``COMPILED_PY``), and ``python -m`` runs only
modules that have Python code."""

from .worker import main

main()

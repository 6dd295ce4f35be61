"""Schedulers decide when, and with which other requests, a backend instance runs a job: Direct or DynamicBatcher.

Start with :mod:`fastoip.scheduling.contract`: what a backend and a scheduler must do, and the
execution context a scheduler receives instead of the repository's ``LoadedModel``.
"""

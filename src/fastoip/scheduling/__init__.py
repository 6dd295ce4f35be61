"""Schedulers decide when and with what a backend instance runs: Direct or DynamicBatcher."""

"""fastoip's own Python models (``fastoip.Model``): in process, on instance threads."""

"""fastoip: a gRPC-first Open Inference Protocol (KServe V2) server with a native tensor codec."""

__version__ = "0.1.0"

"""gRPC frontends: the RPC translation shared by every transport (:mod:`.service`) and the transports."""

from .grpcio_server import create_server
from .service import HEALTH_SERVICE, INT32_MAX, SERVICE, GrpcService

__all__ = ["HEALTH_SERVICE", "INT32_MAX", "SERVICE", "GrpcService", "create_server"]

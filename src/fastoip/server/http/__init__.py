"""The HTTP/REST frontend: the KServe V2 / Triton REST API on uvicorn (httptools + uvloop).

Rooms, one job each:
- :mod:`.router`: raw-ASGI routing, Request / Response, error bodies;
- :mod:`.endpoints`: one handler per endpoint, translating HTTP <-> Core calls;
- :mod:`.bodies`: reading bodies within the limit, gzip / deflate both ways;
- :mod:`.json_docs`: the small JSON documents of the non-infer endpoints;
- :mod:`.openapi`: the OpenAPI document of the routes (``/v2/docs``);
- :mod:`.errors`: the statuses only HTTP has (403, 405, 413);
- :mod:`.protocol`: uvicorn's httptools protocol with head limits and timeouts (431, 408);
- :mod:`.server`: uvicorn in its own thread, with TLS when configured.
Inference bodies are decoded and encoded by the wire codec :mod:`fastoip.wire.http`.
"""

from .endpoints import HttpFrontend
from .server import HttpServer

__all__ = ["HttpFrontend", "HttpServer"]

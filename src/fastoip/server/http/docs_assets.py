"""Swagger UI's files for ``/v2/docs``, served by fastoip itself so the page works without network access.

Rules:
- The files come from the ``swagger-ui-bundle`` package (a dependency, pinned in pyproject.toml: Swagger UI
  4.15.5), read once and kept in memory; only the two files the page loads are served.
- Without that package (installed with ``--no-deps``) each file answers 404 with an error saying what to install;
  ``/v2/docs/openapi.json`` still works.
"""

from __future__ import annotations

from functools import cache

from .router import Response, error_response

#: The files the docs page loads, and their media types.
ASSETS = {
    "swagger-ui-bundle.js": b"application/javascript; charset=utf-8",
    "swagger-ui.css": b"text/css; charset=utf-8",
}


@cache
def _read(name: str) -> bytes | None:
    try:
        from swagger_ui_bundle import swagger_ui_path
    except ImportError:
        return None
    return (swagger_ui_path / name).read_bytes()


def response(name: str) -> Response:
    """The answer for one of :data:`ASSETS`."""
    body = _read(name)
    if body is None:
        return error_response(404, f"{name}: Swagger UI's files are not installed (pip install swagger-ui-bundle); "
                                   "the OpenAPI document is at /v2/docs/openapi.json")
    # the files change only with the package: a browser may keep them for a day
    return Response(200, [(b"content-type", ASSETS[name]), (b"cache-control", b"max-age=86400")], body)

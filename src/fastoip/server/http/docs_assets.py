"""Swagger UI's files for ``/v2/docs``, served by fastoip itself so the page works without network access.

Rules:
- The files are Swagger UI 5 (it renders OpenAPI 3.1; 4.x refuses it), from npm's ``swagger-ui-dist``, put in
  ``swagger_ui/`` beside this module at build time by ``scripts/swagger_ui.py`` (pinned version and integrity
  hash), and carried by the wheel; read once and kept in memory; only the two files the page loads are served.
- A build that could not fetch them (no npm) answers 404 for each, with an error saying how to get them;
  ``/v2/docs/openapi.json`` still works.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

from .router import Response, error_response

#: The files the docs page loads, and their media types.
ASSETS = {
    "swagger-ui-bundle.js": b"application/javascript; charset=utf-8",
    "swagger-ui.css": b"text/css; charset=utf-8",
}
FOLDER = Path(__file__).resolve().parent / "swagger_ui"


@cache
def _read(name: str) -> bytes | None:
    try:
        return (FOLDER / name).read_bytes()
    except OSError:
        return None


def response(name: str) -> Response:
    """The answer for one of :data:`ASSETS`."""
    body = _read(name)
    if body is None:
        return error_response(404, f"{name}: Swagger UI's files were not installed with fastoip (the build needs "
                                   "npm: run python scripts/swagger_ui.py in the source tree, then reinstall); "
                                   "the OpenAPI document is at /v2/docs/openapi.json")
    # the files change only with fastoip: a browser may keep them for a day
    return Response(200, [(b"content-type", ASSETS[name]), (b"cache-control", b"max-age=86400")], body)

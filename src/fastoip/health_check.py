"""``fastoip health``: wait until a server is ready, or say why it is not (the failed model and its error).

Rules:
- A client of the HTTP API only (``/v2/health/ready``, then ``/v2/repository/index`` for why not): it works on any
  V2 server with Triton's repository extension, a Triton included, and imports nothing of the server.
- Ready: exit 0.  A model that failed to load ends the wait at once (it will not become ready by itself), and each
  failed model is named with its error; a server that does not answer, or models still loading, are waited on
  until ``--wait`` runs out.  Every way out that is not ready exits 1 with one line per reason.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

#: models explicitly unloaded are UNAVAILABLE with this reason: not a failure
UNLOADED = "unloaded"


@dataclass(frozen=True)
class Readiness:
    """One look at a server: ``ready``, ``failed`` (a model did not load), ``loading`` or ``down``."""

    kind: str
    lines: tuple[str, ...]


def base_url(url: str) -> str:
    """``host:port`` or ``http(s)://host:port``, without a trailing slash."""
    url = url.rstrip("/")
    return url if url.startswith(("http://", "https://")) else f"http://{url}"


def _get(url: str, method: str = "GET", timeout: float = 5.0) -> tuple[int, bytes]:
    data = b"{}" if method == "POST" else None
    request = urllib.request.Request(url, data=data, method=method)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def look(url: str) -> Readiness:
    """The server's readiness now, with the reasons when it is not ready."""
    url = base_url(url)
    try:
        status, _ = _get(f"{url}/v2/health/ready")
        if status == 200:
            return Readiness("ready", (f"ready: {url}",))
        status, body = _get(f"{url}/v2/repository/index", "POST")
    except (OSError, urllib.error.URLError) as exc:
        reason = getattr(exc, "reason", exc)
        return Readiness("down", (f"no server answers at {url} ({reason})",))
    if status != 200:
        return Readiness("loading", (f"{url} is not ready (its repository index answered {status})",))
    try:
        entries = json.loads(body)
    except ValueError:
        return Readiness("loading", (f"{url} is not ready (its repository index is not JSON)",))
    failed = [entry for entry in entries if entry.get("state") == "UNAVAILABLE"
              and entry.get("reason") and entry.get("reason") != UNLOADED]
    if failed:
        return Readiness("failed", tuple(
            f"model '{entry.get('name')}'" + (f" version {entry['version']}" if entry.get("version") else "")
            + f" failed to load: {entry['reason']}" for entry in failed))
    loading = sorted(str(entry.get("name")) for entry in entries if entry.get("state") == "LOADING")
    if loading:
        return Readiness("loading", (f"{url} is not ready: still loading {', '.join(loading)}",))
    return Readiness("loading", (f"{url} is not ready yet (no model failed; none is loading)",))


def wait_ready(url: str, wait_s: float, interval_s: float = 0.5) -> Readiness:
    """Look until ready, a model failed, or ``wait_s`` is over; the last look."""
    deadline = time.monotonic() + wait_s
    while True:
        state = look(url)
        if state.kind in ("ready", "failed") or time.monotonic() + interval_s > deadline:
            return state
        time.sleep(interval_s)

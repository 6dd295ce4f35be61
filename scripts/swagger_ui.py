"""Put Swagger UI 5 (npm's ``swagger-ui-dist``) beside the server, for ``/v2/docs`` to render OpenAPI 3.1 offline.

Swagger UI before 5 refuses an OpenAPI 3.1 document, and PyPI has no small package of Swagger UI 5, so the build
takes it from the npm registry with npm itself (``npm pack``), checks the tarball against the integrity hash pinned
here, and keeps only the two files the page loads (and their licence) in ``src/fastoip/server/http/swagger_ui/``,
which the wheel carries.  The server never fetches anything: a build without npm serves ``/v2/docs`` with a 404
saying how to get the files, and the OpenAPI document itself still works.

    python scripts/swagger_ui.py           # fetch when missing or of another version; exit 1 with the reason
    python scripts/swagger_ui.py --check   # exit 1 when the files are missing or not this version
"""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

VERSION = "5.36.0"
#: npm's integrity field for swagger-ui-dist-5.36.0.tgz (``npm view swagger-ui-dist@5.36.0 dist.integrity``)
INTEGRITY = "sha512-Lt6/Kb0gXmLdiabLhvso4VdJP9V7qJWB0zh0gzeXUV3+CMOTzMmvpJRSXN7EAjfwixwmoi9ezDbLHiexC7lA9A=="
#: what the page loads, and the licence and notice that must travel with them
FILES = ("swagger-ui-bundle.js", "swagger-ui.css", "LICENSE", "NOTICE")
DEST = Path(__file__).resolve().parent.parent / "src" / "fastoip" / "server" / "http" / "swagger_ui"


def current(dest: Path = DEST) -> bool:
    """Whether ``dest`` holds every file of :data:`VERSION`."""
    marker = dest / "VERSION"
    return marker.is_file() and marker.read_text().strip() == VERSION and all((dest / n).is_file() for n in FILES)


def fetch(dest: Path = DEST) -> str | None:
    """Fetch and unpack Swagger UI into ``dest``; None when done, else why not (one line)."""
    npm = shutil.which("npm")
    if npm is None:
        return "npm not found (Debian: apt-get install npm)"
    with tempfile.TemporaryDirectory(prefix="fastoip-swagger-") as tmp:
        try:
            done = subprocess.run(
                [npm, "pack", f"swagger-ui-dist@{VERSION}", "--json", "--pack-destination", tmp],
                capture_output=True, text=True, timeout=300, cwd=tmp,
            )
        except subprocess.TimeoutExpired:
            return "npm pack took more than 300 s"
        if done.returncode != 0:
            return "npm pack failed: " + (done.stderr.strip().splitlines() or ["(no message)"])[-1]
        tarball = Path(tmp) / json.loads(done.stdout)[0]["filename"]
        digest = "sha512-" + base64.b64encode(hashlib.sha512(tarball.read_bytes()).digest()).decode()
        if digest != INTEGRITY:
            return f"{tarball.name}: integrity {digest} is not the pinned {INTEGRITY}"
        staging = Path(tmp) / "swagger_ui"
        staging.mkdir()
        with tarfile.open(tarball) as archive:
            for name in FILES:
                member = archive.extractfile(f"package/{name}")
                if member is None:
                    return f"{tarball.name} has no package/{name}"
                (staging / name).write_bytes(member.read())
        (staging / "VERSION").write_text(VERSION + "\n")
        if dest.exists():
            shutil.rmtree(dest)
        shutil.copytree(staging, dest)
    return None


def main(argv: list[str]) -> int:
    if current():
        return 0
    if "--check" in argv:
        print(f"fastoip: Swagger UI {VERSION} is not in {DEST} (python scripts/swagger_ui.py fetches it)")
        return 1
    print(f"fastoip: fetching Swagger UI {VERSION} for /v2/docs (npm pack swagger-ui-dist@{VERSION})", flush=True)
    why = fetch()
    if why is not None:
        print(f"fastoip: Swagger UI not fetched: {why}; /v2/docs will answer 404 (the OpenAPI document at "
              "/v2/docs/openapi.json still works)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

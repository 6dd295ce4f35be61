"""Model repositories on object storage (``s3://``, ``gs://``, ``as://``, as Triton spells them), copied locally.

Rules:
- Read through fsspec's filesystems (``s3fs``, ``gcsfs``, ``adlfs``: extras ``s3``, ``gcs``, ``azure``):
  one interface for the three clouds, each reading credentials the way its cloud's SDK does (S3: the
  AWS_* variables, ``~/.aws``, instance roles; GCS: GOOGLE_APPLICATION_CREDENTIALS or the metadata
  server; Azure: Triton's AZURE_STORAGE_ACCOUNT / AZURE_STORAGE_KEY, else adlfs's own variables).
- Triton's forms: ``s3://bucket/path``; ``s3://[http[s]://]host:port/bucket/path`` for an S3-compatible
  server (plain HTTP unless ``https://`` is given); ``gs://bucket/path``; ``as://account/container/path``.
- The repository is copied into a local folder that the ordinary repository code serves.  :meth:`sync`
  copies what changed (size or ETag/mtime differ) and deletes what vanished, each file written beside
  its place and renamed over it, so a reader never sees half a file.  In ``poll`` mode the poller syncs
  before each scan, so a changed version reloads and a deleted one unloads as for a local repository.
- A key that does not map to a file path (an empty segment as in ``repo//x``, legal in S3; ``.`` or ``..``)
  is skipped with a warning, once per key (issue 37: ``repo//x`` was read as ``repo/x``, which does not exist,
  and the server did not start).
- A failing sync at start is a start-time error naming the URL and the cause (no bucket, no access), and the
  local copy it began is removed (a temporary folder the repository made itself); while polling it is logged
  and the models already loaded keep serving (a bucket that vanishes or credentials that expire do not unload
  anything).
- Any other ``scheme://`` given as a repository is an error naming the scheme: it is not a local path.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import InvalidArgument, Unavailable

log = logging.getLogger("fastoip.repository")

#: Triton's scheme -> (fsspec protocol, the package that brings it, fastoip's extra).
SCHEMES: dict[str, tuple[str, str, str]] = {
    "s3": ("s3", "s3fs", "s3"),
    "gs": ("gcs", "gcsfs", "gcs"),
    "as": ("abfs", "adlfs", "azure"),
}
_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://(.*)$")
_S3_ENDPOINT = re.compile(r"^(https?://)?([^/]+:\d+)/(.+)$")


@dataclass(frozen=True)
class RemoteLocation:
    """Where a repository lives: the scheme as given, fsspec's protocol, ``bucket/path`` and the filesystem options."""

    url: str
    scheme: str
    protocol: str
    path: str
    options: dict[str, Any] = field(default_factory=dict)


def parse_location(text: str) -> RemoteLocation | None:
    """The object-storage location ``text`` names; None for a local path; InvalidArgument for another scheme."""
    match = _URL.match(text)
    if match is None:
        return None
    scheme, rest = match[1].lower(), match[2]
    if scheme not in SCHEMES:
        raise InvalidArgument(
            f"model repository '{text}': the scheme '{scheme}://' is not supported; fastoip reads local "
            "folders and object storage as s3://, gs:// or as://"
        )
    options: dict[str, Any] = {}
    if scheme == "s3":
        endpoint = _S3_ENDPOINT.match(rest)
        if endpoint is not None:  # an S3-compatible server, as Triton spells it
            options["endpoint_url"] = (endpoint[1] or "http://") + endpoint[2]
            rest = endpoint[3]
    elif scheme == "as":
        account, _, rest = rest.partition("/")
        options["account_name"] = account
        if os.environ.get("AZURE_STORAGE_KEY"):
            options["account_key"] = os.environ["AZURE_STORAGE_KEY"]
    path = rest.strip("/")
    if not path:
        raise InvalidArgument(f"model repository '{text}' names no bucket")
    return RemoteLocation(text, scheme, SCHEMES[scheme][0], path, options)


class RemoteRepository:
    """A repository on object storage and its local copy (``local``)."""

    def __init__(self, location: RemoteLocation, cache: Path | None = None) -> None:
        self.location = location
        #: Whether ``local`` is a folder this repository made (removed when the first sync fails).
        self.owns_local = cache is None
        self.local = cache or Path(tempfile.mkdtemp(prefix="fastoip-repository-"))
        self.local.mkdir(parents=True, exist_ok=True)
        #: Relative path -> what identified its copied version (size, ETag or mtime).
        self._copied: dict[str, tuple] = {}
        self._fs: Any = None
        self.synced = False
        #: Keys skipped because they name no file path (warned about once each).
        self.skipped: set[str] = set()

    def _filesystem(self) -> Any:
        if self._fs is None:
            protocol, package, extra = SCHEMES[self.location.scheme]
            try:
                import fsspec

                self._fs = fsspec.filesystem(protocol, skip_instance_cache=True, **self.location.options)
            except ImportError as exc:
                raise InvalidArgument(
                    f"model repository '{self.location.url}' needs {package}: pip install 'fastoip[{extra}]' "
                    f"({exc})"
                ) from None
        return self._fs

    def sync(self) -> bool:
        """Copy what changed on the storage into ``local``; True when a file was written or removed."""
        try:
            changed = self._sync()
        except BaseException:
            if not self.synced and self.owns_local:  # the start fails: leave no copy behind
                self.close()
            raise
        self.synced = True
        return changed

    def _sync(self) -> bool:
        fs = self._filesystem()
        root = self.location.path
        try:
            fs.invalidate_cache()
            listing = fs.find(root, detail=True)
            if not listing and not fs.exists(root):
                raise FileNotFoundError(f"no such bucket or folder: {root}")
        except Exception as exc:
            raise Unavailable(f"cannot read model repository '{self.location.url}': {_describe(exc)}") from None
        remote: dict[str, tuple] = {}
        for name, info in listing.items():
            if info.get("type", "file") != "file":
                continue
            relative = name[len(root) + 1:] if name.startswith(root + "/") else ""
            if not relative or any(part in ("", ".", "..") for part in relative.split("/")):
                if name not in self.skipped:  # never write outside the cache, nor read another key's name
                    self.skipped.add(name)
                    log.warning("model repository '%s': object '%s' names no file path (an empty, '.' or '..' "
                                "segment); skipped", self.location.url, name)
                continue
            remote[relative] = (info.get("size"), info.get("ETag") or info.get("etag") or info.get("md5Hash")
                                or str(info.get("LastModified") or info.get("mtime") or info.get("updated")))
        changed = False
        for relative, stamp in sorted(remote.items()):
            if self._copied.get(relative) == stamp:
                continue
            target = self.local / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            partial = target.with_name(f".{target.name}.partial")
            try:
                fs.get_file(f"{root}/{relative}", str(partial))
            except Exception as exc:
                partial.unlink(missing_ok=True)
                raise Unavailable(
                    f"cannot copy '{relative}' from model repository '{self.location.url}': {_describe(exc)}"
                ) from None
            os.replace(partial, target)
            self._copied[relative] = stamp
            changed = True
        for relative in sorted(set(self._copied) - set(remote)):
            (self.local / relative).unlink(missing_ok=True)
            del self._copied[relative]
            _remove_empty_parents(self.local / relative, self.local)
            changed = True
        return changed

    def close(self) -> None:
        shutil.rmtree(self.local, ignore_errors=True)


def _remove_empty_parents(path: Path, top: Path) -> None:
    folder = path.parent
    while folder != top and folder.is_dir() and not any(folder.iterdir()):
        folder.rmdir()
        folder = folder.parent


def _describe(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return f"{type(exc).__name__}: {text}" if type(exc).__name__ not in text else text

"""Each generation model's tokenizer (:mod:`fastoip.wire.openai.tokenizer`), found from its config and folder.

Where: the config parameter ``tokenizer: "bytes"``; else ``tokenizer.json`` in the model's folder, when the
``tokenizers`` package is installed (it is optional); else none.  ``tokenizer.json`` is read (at most 64 MiB: a
large vocabulary's file is tens of MB) and built in the executor, so the loop keeps serving while it loads; it is
read again when its modification time changes, looked at no more than once a second per folder; at most 256
folders are remembered.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from ....errors import InternalError
from ....wire.openai.tokenizer import BytesTokenizer, HuggingFaceTokenizer, Tokenizer, have_huggingface_tokenizers

TOKENIZER_FILE = "tokenizer.json"
MAX_FILE_BYTES = 64 << 20
MAX_CACHED = 256
RECHECK_S = 1.0
BYTES = BytesTokenizer()


def _load(path: Path) -> HuggingFaceTokenizer:
    with path.open("rb") as file:
        data = file.read(MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES:
        raise InternalError(f"{path.name} of model '{path.parent.name}' is over {MAX_FILE_BYTES} bytes")
    try:
        return HuggingFaceTokenizer.from_json(data.decode("utf-8", "replace"))
    except Exception as exc:  # the tokenizers package's own error types: the file is the model's fault
        raise InternalError(f"{path.name} of model '{path.parent.name}' does not load: {exc}") from None


class ModelTokenizers:
    def __init__(self) -> None:
        #: folder -> (when its file was last looked at, its modification time, the tokenizer or None)
        self._cache: dict[Path, tuple[float, int, Tokenizer | None]] = {}
        self.huggingface = have_huggingface_tokenizers()
        self._loading: dict[Path, asyncio.Future[HuggingFaceTokenizer]] = {}

    async def get(self, directory: Path, parameter: str | None) -> Tokenizer | None:
        if parameter == "bytes":
            return BYTES
        if not self.huggingface:
            return None
        now = time.monotonic()
        cached = self._cache.get(directory)
        if cached is not None and now - cached[0] < RECHECK_S:
            return cached[2]
        path = directory / TOKENIZER_FILE
        try:
            stamp = path.stat().st_mtime_ns
        except OSError:
            stamp = -1
        if cached is not None and cached[1] == stamp:
            tokenizer = cached[2]
        elif stamp < 0:
            tokenizer = None
        else:
            loading = self._loading.get(directory)
            if loading is None:  # one load per folder at a time, however many requests wait for it
                loading = asyncio.get_running_loop().run_in_executor(None, _load, path)
                self._loading[directory] = loading
                loading.add_done_callback(lambda _: self._loading.pop(directory, None))
            tokenizer = await asyncio.shield(loading)
        self._cache.pop(directory, None)
        if len(self._cache) >= MAX_CACHED:
            del self._cache[next(iter(self._cache))]
        self._cache[directory] = (now, stamp, tokenizer)
        return tokenizer

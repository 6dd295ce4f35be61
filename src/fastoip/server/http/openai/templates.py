"""A model's chat template, read from its folder and compiled once per change of the files.

Where (Hugging Face's convention, as vLLM and Triton's frontend read it): ``chat_template.jinja`` in the model's
folder, else ``tokenizer_config.json``'s ``chat_template``; neither: the default template.  The files are read
again when their modification time changes (a model reloaded with another template), looked at no more than
once a second per folder (two ``stat`` calls a chat request showed in profiles).  At most 1 MiB is read of
either file: a template is text, not data; at most 256 folders are remembered.  Compiling runs in the executor
(a 4.5 KB template of Llama 3.1's shape took 200 ms to compile, 0.15 to 1 ms to render 2 to 50 messages: the
compile would stall the loop; rendering stays on it unless the conversation is large, see :mod:`.endpoints`).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import orjson

from ....errors import InternalError
from ....wire.openai.chat import DEFAULT_TEMPLATE, ChatTemplate, template_from_tokenizer_config

TEMPLATE_FILE = "chat_template.jinja"
TOKENIZER_CONFIG = "tokenizer_config.json"
MAX_FILE_BYTES = 1 << 20
#: Folders remembered at most (a model loaded with uploaded files gets a new folder each load): oldest go first.
MAX_CACHED = 256
#: Seconds a folder's template is used before its files' modification times are looked at again.
RECHECK_S = 1.0


def _stamp(path: Path) -> int:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return -1


def _read(path: Path) -> bytes:
    with path.open("rb") as file:
        data = file.read(MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES:
        raise InternalError(f"{path.name} of model '{path.parent.name}' is over {MAX_FILE_BYTES} bytes")
    return data


class ChatTemplates:
    """The compiled template of each model, by its folder."""

    def __init__(self) -> None:
        #: folder -> (when its files were last looked at, their modification times, the template)
        self._cache: dict[Path, tuple[float, tuple[int, int], ChatTemplate]] = {}
        self._default: ChatTemplate | None = None
        self._loading: dict[Path, asyncio.Future[ChatTemplate]] = {}

    async def get(self, directory: Path) -> ChatTemplate:
        cached = self._cache.get(directory)
        now = time.monotonic()
        if cached is not None and now - cached[0] < RECHECK_S:
            return cached[2]
        stamp = (_stamp(directory / TEMPLATE_FILE), _stamp(directory / TOKENIZER_CONFIG))
        if cached is not None and cached[1] == stamp:
            self._cache[directory] = (now, stamp, cached[2])
            return cached[2]
        loading = self._loading.get(directory)
        if loading is None:  # one compile per folder at a time, however many requests wait for it
            loading = asyncio.get_running_loop().run_in_executor(None, self._load, directory, stamp)
            self._loading[directory] = loading
            loading.add_done_callback(lambda _: self._loading.pop(directory, None))
        template = await asyncio.shield(loading)  # a client that leaves does not cancel the others' wait
        self._cache.pop(directory, None)
        if len(self._cache) >= MAX_CACHED:
            del self._cache[next(iter(self._cache))]
        self._cache[directory] = (now, stamp, template)
        return template

    def _load(self, directory: Path, stamp: tuple[int, int]) -> ChatTemplate:
        """The folder's template, compiled (in the executor)."""
        template_file, tokenizer_config = directory / TEMPLATE_FILE, directory / TOKENIZER_CONFIG
        template = None
        if stamp[0] >= 0:
            template = ChatTemplate(_read(template_file).decode("utf-8", "replace"))
        elif stamp[1] >= 0:
            try:
                config = orjson.loads(_read(tokenizer_config))
            except orjson.JSONDecodeError as exc:
                raise InternalError(f"{TOKENIZER_CONFIG} of model '{directory.name}' is not JSON: {exc}") from None
            template = template_from_tokenizer_config(config) if isinstance(config, dict) else None
        if template is None:
            if self._default is None:
                self._default = ChatTemplate(DEFAULT_TEMPLATE)
            template = self._default
        return template

"""A generation model's tokenizer, where it has one: token-id prompts decoded, and tokens counted for ``usage``.

Rules:
- ``bytes`` (config parameter ``tokenizer: "bytes"``, the embeddings' tokenizer): each UTF-8 byte is a token, id =
  byte + 3; ids 0 to 2 (padding, ``[CLS]``, ``[SEP]``) decode to nothing; an id past 258 is refused.  A text's
  count is its UTF-8 length.
- A Hugging Face ``tokenizer.json`` in the model's folder, read by the ``tokenizers`` package (optional: without it
  the file is not used): decoding skips special tokens (as vLLM's ``skip_special_tokens``), an id past the
  vocabulary is refused; a text's count is its encoding's length without special tokens added.
- A refused id raises ValueError naming it (the caller answers 400 naming ``prompt``).
"""

from __future__ import annotations

import importlib.util
from typing import Any, Protocol

from .embeddings import BYTE_OFFSET, VOCABULARY


class Tokenizer(Protocol):
    name: str

    def count(self, text: str) -> int: ...

    def decode(self, ids: list[int]) -> str: ...


class BytesTokenizer:
    name = "bytes"

    def count(self, text: str) -> int:
        return len(text.encode())

    def decode(self, ids: list[int]) -> str:
        bad = next((i for i in ids if i >= VOCABULARY), None)
        if bad is not None:
            raise ValueError(f"token id {bad} is past the 'bytes' tokenizer's vocabulary (0 to {VOCABULARY - 1})")
        return bytes(i - BYTE_OFFSET for i in ids if i >= BYTE_OFFSET).decode("utf-8", "replace")


class HuggingFaceTokenizer:
    """A ``tokenizers.Tokenizer`` (its ``tokenizer.json``)."""

    name = "tokenizer.json"

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.vocabulary = int(tokenizer.get_vocab_size(with_added_tokens=True))

    @classmethod
    def from_json(cls, text: str) -> HuggingFaceTokenizer:
        from tokenizers import Tokenizer as Loaded

        return cls(Loaded.from_str(text))

    def count(self, text: str) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: list[int]) -> str:
        bad = next((i for i in ids if i >= self.vocabulary), None)
        if bad is not None:
            raise ValueError(f"token id {bad} is past the tokenizer's vocabulary (0 to {self.vocabulary - 1})")
        return str(self.tokenizer.decode(ids, skip_special_tokens=True))


def have_huggingface_tokenizers() -> bool:
    """Whether the optional ``tokenizers`` package is installed (found, not imported: 17 ms off the start-up)."""
    return importlib.util.find_spec("tokenizers") is not None

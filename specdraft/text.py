"""Prompt text's one check, the fewest tokens a text can be, incremental detokenization and stop-string
matching for streamed output."""

from __future__ import annotations

import json
from typing import Any, Sequence

from specdraft.errors import RequestError

# Pre-tokenizers that split text without dropping any of it (Split and Punctuation unless "Removed").
_KEEPING = {"ByteLevel", "Digits", "Split", "Punctuation"}


def check_text(prompt: str) -> str:
    """Prompt text, refused where it is empty or only whitespace, or not valid Unicode (`check_unicode`);
    light: the CLI checks before it loads a model."""
    if not prompt.strip():
        raise RequestError("prompt is empty", param="prompt")
    check_unicode(prompt, "prompt")
    return prompt


def check_unicode(text: str, what: str) -> None:
    """Refuse text that is not valid Unicode, naming `what` it is (a field, an option) and where: a lone
    surrogate (U+D800-U+DFFF), as JSON's "\\ud800" and Python's surrogateescape of a byte that is not
    UTF-8 make, which no tokenizer can encode. RequestError, its `param` `what`."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise RequestError(f"{what} is not valid Unicode: a lone surrogate U+{ord(text[exc.start]):04X} at index "
                           f"{exc.start} (text must be UTF-8)", param=what) from None


def characters_per_token(tokenizer: Any) -> int | None:
    """The most characters one token of `tokenizer` covers, where that bounds a text's tokens from
    below (n characters are at least n / this many tokens); None where no bound is sound.

    Sound for a byte-level BPE that neither normalizes the text nor drops any of it while splitting:
    its tokens' bytes are the text's UTF-8 bytes (and added tokens' texts), and a character is at least
    one byte. A normalizer (NFC, lowercasing, stripping) may shrink the text, and an added token that
    strips the spaces beside it covers more than its own text: with either, there is no bound."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or not hasattr(tokenizer, "get_vocab"):
        return None
    spec = json.loads(backend.to_str())
    pre = spec.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else [pre]
    byte_level = any(step.get("type") == "ByteLevel" for step in steps)
    keeps = all(step.get("type") in _KEEPING and step.get("behavior") != "Removed" for step in steps)
    strips = any(added.get("lstrip") or added.get("rstrip") for added in spec.get("added_tokens", []))
    if spec.get("normalizer") is not None or spec.get("model", {}).get("type") != "BPE" or not (byte_level and keeps) or strips:
        return None
    return max(len(token) for token in tokenizer.get_vocab())


class IncrementalDetokenizer:
    """Emits text as tokens arrive, holding back bytes that do not yet form whole characters.

    Decodes only a short window of recent tokens per call, so cost does not grow with output length.
    """

    def __init__(self, tokenizer, stop: Sequence[str] = ()) -> None:
        self.tokenizer = tokenizer
        self.stop = tuple(stop)
        self._hold = max((len(s) for s in self.stop), default=1) - 1  # chars that might start a stop string
        self.ids: list[int] = []
        self._prefix = 0  # ids[_prefix:_read] decode to text already emitted
        self._read = 0
        self.text = ""  # all text so far, including any held back
        self._emitted = 0  # len of text already returned

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def add(self, token_ids: Sequence[int]) -> tuple[str, bool]:
        """Add tokens; return (new text, whether a stop string was hit). After a hit, text ends before it."""
        self.ids.extend(token_ids)
        prefix_text = self._decode(self.ids[self._prefix : self._read])
        new_text = self._decode(self.ids[self._prefix :])
        if len(new_text) > len(prefix_text) and not new_text.endswith("\ufffd"):
            self.text += new_text[len(prefix_text) :]
            self._prefix, self._read = self._read, len(self.ids)
        search_from = max(0, self._emitted - self._hold)
        hits = [i for i in (self.text.find(s, search_from) for s in self.stop) if i >= 0]
        if hits:
            self.text = self.text[: min(hits)]
            return self._take(len(self.text)), True
        return self._take(len(self.text) - self._hold if self.stop else len(self.text)), False

    def flush(self) -> str:
        """Release held-back text at the end of generation."""
        return self._take(len(self.text))

    def _take(self, end: int) -> str:
        end = max(end, self._emitted)
        out = self.text[self._emitted : end]
        self._emitted = end
        return out

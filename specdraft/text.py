"""Prompt text's one check, incremental detokenization and stop-string matching for streamed output."""

from __future__ import annotations

from typing import Sequence

from specdraft.errors import RequestError


def check_text(prompt: str) -> str:
    """Prompt text, refused where it is empty or only whitespace (light: the CLI checks before it loads a model)."""
    if not prompt.strip():
        raise RequestError("prompt is empty", param="prompt")
    return prompt


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

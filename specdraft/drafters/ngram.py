"""The default `ngram` drafter. For now the scanning prompt lookup; the indexed tables replace it."""

from __future__ import annotations

from typing import Any

from specdraft.drafters import register
from specdraft.drafters.prompt_lookup import ScanPromptLookupDrafter


@register("ngram")
def _create(k: int = 5, **_: Any) -> ScanPromptLookupDrafter:
    return ScanPromptLookupDrafter(k=k)

"""The per-domain benchmark's methods by name: whose each is (ours, Hugging Face's, llama.cpp's), and the
order the reports list them in."""

from __future__ import annotations

from benchmarks.peers.llama_cpp import PLAIN as LLAMA_CPP_PLAIN, PREFIX as LLAMA_CPP

BASELINE = "specdraft-none"
HF_PLAIN = "hf-generate"
PEERS = ("hf-", LLAMA_CPP)  # the peers' methods begin so; every other method is ours


def is_peer(method: str) -> bool:
    return method.startswith(PEERS)


def family(method: str) -> str:
    """Whose method it is: "hf", "llama.cpp" or "specdraft"."""
    return "hf" if method.startswith("hf-") else "llama.cpp" if method.startswith(LLAMA_CPP) else "specdraft"


def method_order(methods: list[str]) -> list[str]:
    """Ours first (none leading), then Hugging Face (plain generate leading), then llama.cpp (its plain
    decoding leading); otherwise first-seen order."""
    seen = list(dict.fromkeys(methods))

    def key(method: str) -> tuple:
        peer = next((i + 1 for i, prefix in enumerate(PEERS) if method.startswith(prefix)), 0)
        lead = method in (BASELINE, HF_PLAIN, LLAMA_CPP_PLAIN)
        return (peer, not lead, seen.index(method))

    return sorted(seen, key=key)

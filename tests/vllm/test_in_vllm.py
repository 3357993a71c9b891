"""Our proposer inside vLLM (the CPU build in .venv-vllm): greedy outputs with it are vLLM's own
outputs without speculation, token for token, on a tiny Llama and on the embedded model, for 16
requests of different prompt lengths and budgets that finish at different steps with `max_num_seqs`
4 (rows compact and get reused), also when vLLM preempts requests; each request's drafter tables are
built once. vLLM builds the proposer from its own config. Run with `.venv-vllm/bin/python -m pytest tests/vllm`."""

from __future__ import annotations

import random

import pytest

pytest.importorskip(
    "vllm.v1.spec_decode.custom_class_proposer",
    reason="needs vLLM with the custom proposer hook, which the main .venv does not have: "
           "bash scripts/setup_vllm.sh, then .venv-vllm/bin/python -m pytest tests/vllm",
)

from tests.helpers.prompts import E2E_PROMPTS  # noqa: E402
from benchmarks.peers.vllm_engines import PROPOSER, TINY_VOCAB, run_engines  # noqa: E402

K = 4
REQUESTS = 16
TINY = {"skip_tokenizer_init": True}  # the tiny model has no tokenizer; prompts are token ids


def ours(**extra) -> dict:
    return {"method": "custom_class", "model": PROPOSER, "num_speculative_tokens": K, **extra}


def check_tracker(run, requests: int = REQUESTS) -> None:
    stats = run.tracker["stats"]
    assert stats.begun == requests  # each request's tables built once, never rebuilt
    assert stats.rematched > 0  # rows moved (compaction) or requests came back, and were followed
    assert stats.ended + run.tracker["live"] == stats.begun


# -- vLLM's own config ----------------------------------------------------------------------------


def engine_config(model: str, **args):
    from vllm.engine.arg_utils import EngineArgs

    return EngineArgs(model=model, dtype="float32", max_model_len=512, max_num_seqs=6,
                      speculative_config=ours(), **TINY, **args).create_engine_config()


def test_vllm_builds_the_proposer_from_its_config(tiny_llama, monkeypatch):
    from vllm.v1.spec_decode.custom_class_proposer import create_custom_proposer

    monkeypatch.delenv("SPECDRAFT_VLLM_DRAFTER", raising=False)
    config = engine_config(tiny_llama, additional_config={"specdraft": {"options": {"max_n": 3}}})
    assert not config.scheduler_config.async_scheduling  # vLLM turns it off for custom proposers
    proposer = create_custom_proposer(config)
    assert (proposer.drafter_name, proposer.k, proposer.rows.max_model_len) == ("ngram", K, 512)
    assert proposer.rows.drafter.max_n == 3 and proposer.rows.capacity == 6

    monkeypatch.setenv("SPECDRAFT_VLLM_DRAFTER", "prompt-lookup-scan")  # no additional_config: the environment
    assert create_custom_proposer(engine_config(tiny_llama)).drafter_name == "prompt-lookup-scan"

    monkeypatch.setenv("SPECDRAFT_VLLM_DRAFTER", "model")
    with pytest.raises(RuntimeError, match="drafter 'model' needs a second model, which vLLM's custom proposer"):
        create_custom_proposer(engine_config(tiny_llama))


# -- tiny Llama -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_requests() -> tuple[list[list[int]], list[int]]:
    """16 prompts of 3..150 tokens with budgets of 5..95 tokens, all different; half the prompts
    repeat a phrase, so that prompt lookup finds something to copy."""
    rng = random.Random(0)
    lengths = rng.sample(range(3, 151), REQUESTS)
    budgets = rng.sample(range(5, 96), REQUESTS)
    prompts = []
    for j, length in enumerate(lengths):
        phrase = [rng.randrange(TINY_VOCAB) for _ in range(rng.randint(3, 8))]
        tokens = phrase * (length // len(phrase) + 1) if j % 2 else [rng.randrange(TINY_VOCAB) for _ in range(length)]
        prompts.append(tokens[:length])
    return prompts, budgets


@pytest.fixture(scope="module")
def tiny_runs(tiny_llama, tiny_requests):
    """vLLM without speculation, then with our proposer at its defaults (the `ngram` drafter)."""
    return run_engines(tiny_llama, *tiny_requests, TINY, {**TINY, "speculative_config": ours()})


def test_tiny_llama_greedy_output_with_our_ngram_is_vllms_own(tiny_requests, tiny_runs):
    plain, run = tiny_runs
    assert [len(o) for o in plain.outputs] == tiny_requests[1]  # no EOS: each request runs out its own budget
    assert run.outputs == plain.outputs
    assert run.tracker["drafter"] == "NgramDrafter"
    assert run.metrics["vllm:spec_decode_num_accepted_tokens"] > 0
    check_tracker(run)


def test_drafter_chosen_in_additional_config_runs_in_vllm(tiny_llama, tiny_requests, tiny_runs):
    choice = {"specdraft": {"drafter": "prompt-lookup-scan", "options": {"max_n": 4}}}
    (run,) = run_engines(tiny_llama, *tiny_requests, {**TINY, "speculative_config": ours(), "additional_config": choice})
    assert run.tracker["drafter"] == "ScanPromptLookupDrafter"
    assert run.outputs == tiny_runs[0].outputs
    assert run.metrics["vllm:spec_decode_num_accepted_tokens"] > 0


def test_preempted_requests_keep_their_tables(tiny_llama, tiny_requests, tiny_runs):
    """A KV cache of 512 tokens for 4 running requests of up to 245 tokens: vLLM preempts requests
    and recomputes them later, in whatever row is free; outputs stay vLLM's own."""
    (run,) = run_engines(tiny_llama, *tiny_requests, {**TINY, "speculative_config": ours(), "max_model_len": 448,
                                                      "block_size": 32, "kv_cache_bytes": 512 * 1024})
    assert run.metrics["vllm:num_preemptions"] > 0
    assert run.outputs == tiny_runs[0].outputs
    check_tracker(run)  # preempted requests came back within the grace period: matched, not rebuilt


# -- the embedded model ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def embedded_requests(embedded_dir) -> tuple[list[list[int]], list[int]]:
    """16 plain-text prompts (the start of the end-to-end prompts, 4 to 34 words) with budgets of
    4..34 tokens: vLLM's CPU kernels run this model at ~0.1 s a step here, prefill included."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(embedded_dir)
    texts = [E2E_PROMPTS[name].split() for name in sorted(E2E_PROMPTS)]
    prompts = [tokenizer(" ".join(texts[j % len(texts)][: 4 + 2 * j])).input_ids for j in range(REQUESTS)]
    budgets = [4 + 2 * j for j in range(REQUESTS)]
    return [list(p) for p in prompts], budgets


def test_embedded_model_greedy_output_with_our_ngram_is_vllms_own(embedded_dir, embedded_requests):
    engine = {"kv_cache_bytes": 256 << 20}
    plain, run = run_engines(embedded_dir, *embedded_requests, engine, {**engine, "speculative_config": ours()})
    assert len({len(o) for o in plain.outputs}) > REQUESTS // 2  # requests finish at many different steps
    assert run.outputs == plain.outputs
    assert run.metrics["vllm:spec_decode_num_accepted_tokens"] > 0
    check_tracker(run)

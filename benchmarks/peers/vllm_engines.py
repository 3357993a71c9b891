"""Running vLLM engines, with or without our proposer, each batch of them in a fresh process, and
reading back their outputs, vLLM's own metrics and our proposer's row tracker.

A fresh process per batch because vLLM 0.32 cannot start an engine in a process that has imported
numba: each engine start rescans every loaded module for its kernel registry and fails on llvmlite's
`ffi.lib` ("'_lib_fn_wrapper' object has no attribute 'get'"). Our drafters and vLLM's own n-gram
proposer both import numba when their engine starts, so in one process any number of engines without
speculation may run, then one with it, last; and nothing that imports numba may run before them. Inside that process the engine core runs in-process,
so our proposer can be read directly, on one OpenMP thread that vLLM does not pin to a core: on a
2-core machine that is busy with anything else, vLLM's default two pinned, spinning threads make
each step 20 times slower.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
from dataclasses import dataclass
from typing import Any, Callable, TypeVar

PROPOSER = "specdraft.integrations.vllm.Proposer"
TINY_VOCAB = 256
T = TypeVar("T")
ENGINE_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "1"}


@dataclass
class VllmRun:
    outputs: list[list[int]]  # generated token ids per request, in request order
    metrics: dict[str, Any]  # vLLM's own counters (spec decode, preemptions)
    tracker: dict | None = None  # our proposer's RowTracker: stats, live requests, drafter class


def in_fresh_process(fn: Callable[..., T], *args: Any) -> T:
    """fn(*args) in a fresh (spawned) process, with ENGINE_ENV set before vLLM is imported there."""
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(_with_engine_env, (fn, *args))


def _with_engine_env(fn: Callable[..., T], *args: Any) -> T:
    os.environ.update(ENGINE_ENV)
    return fn(*args)


def run_engines(model: str, prompts: list[list[int]], budgets: list[int], *engines: dict) -> list[VllmRun]:
    """Greedy outputs for the prompts (each with its own budget) from each engine in turn, all in one
    fresh process. An engine is given as `run_engine`'s keyword arguments; only the last may speculate."""
    assert not any(engine.get("speculative_config") for engine in engines[:-1]), "speculating engines go last"
    return in_fresh_process(_run_all, model, prompts, budgets, engines)


def _run_all(model: str, prompts: list[list[int]], budgets: list[int], engines: tuple[dict, ...]) -> list[VllmRun]:
    return [run_engine(model, prompts, budgets, **engine) for engine in engines]


def run_engine(model: str, prompts: list[list[int]], budgets: list[int], speculative_config: dict | None = None,
               env: dict[str, str] | None = None, max_num_seqs: int = 4, max_model_len: int = 1024,
               kv_cache_bytes: int = 64 << 20, **engine_args) -> VllmRun:
    """One vLLM engine (fp32, eager, `env` set first) in this process; see `run_engines`."""
    from vllm import LLM, SamplingParams

    os.environ.update(env or {})
    llm = LLM(model=model, dtype="float32", enforce_eager=True, seed=0, max_model_len=max_model_len,
              max_num_seqs=max_num_seqs, kv_cache_memory_bytes=kv_cache_bytes, disable_log_stats=False,
              speculative_config=speculative_config, **engine_args)
    try:
        params = [SamplingParams(temperature=0.0, max_tokens=n, detokenize=False) for n in budgets]
        results = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        outputs = [list(r.outputs[0].token_ids) for r in results]
        metrics = {m.name: getattr(m, "values", None) or getattr(m, "value", None) for m in llm.get_metrics()}
        tracker = None
        if speculative_config and speculative_config.get("model") == PROPOSER:
            (tracker,) = llm.collective_rpc(_tracker_state)
        return VllmRun(outputs, metrics, tracker)
    finally:
        del llm
        gc.collect()


def _tracker_state(worker) -> dict:
    rows = worker.model_runner.drafter.rows
    return {"stats": rows.stats, "live": rows.live, "drafter": type(rows.drafter).__name__}

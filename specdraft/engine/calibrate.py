"""Start-up measurements: verify passes at the corners of (batch, width), and each drafter that
drafts only when asked, timed on throwaway rows and reported to the policy, so that its first
choices rest on this machine's costs rather than on guesses."""

from __future__ import annotations

import time
from typing import Mapping

import numpy as np

from specdraft.drafters.base import Draft, Drafter, Parts
from specdraft.params import SamplingParams
from specdraft.policy import DraftingTiming, DraftPolicy, StepReport, VerifyTiming
from specdraft.verifier import Verifier

PASSES = (2, 4, 8, 16, 32)  # one row's pass lengths timed besides the plain step and k + 1
REPEATS = 4  # timings per case; the first pays one-off allocation and kernel selection and is dropped


def draft_lengths(k: int, compiled_tokens: int) -> list[int]:
    """One row's draft lengths to time: 0, k, and below k the passes of `PASSES` tokens and, where a
    compiled step runs passes of up to `compiled_tokens`, the longest it runs and the next: a pass's
    cost need not be linear in its tokens, and changes regime where the compiled step ends."""
    passes = {*PASSES, *((compiled_tokens, compiled_tokens + 1) if compiled_tokens else ())}
    return sorted({0, k, *(n - 1 for n in passes if n - 1 < k)})


def calibrate(verifier: Verifier, drafters: Mapping[str, Drafter], parts: Mapping[str, Parts], policy: DraftPolicy,
              k: int, max_batch: int) -> None:
    """Time verify steps at the corners of (batch, width) (and, where the verifier packs rows, one row
    drafting k in a full batch: what a few strong drafts cost there) and each drafter's costly part."""
    prompt = [int(t) % verifier.vocab_size for t in range(3, 3 + max(32, k + 1))]  # drafts of k fit
    greedy = SamplingParams(max_tokens=4 * (k + 1) + 4)
    draft = Draft(np.asarray(prompt[:k], dtype=np.int32))
    for batch in sorted({1, max_batch}):
        ids = [f"__calibrate-{i}" for i in range(batch)]
        for row_id in ids:
            verifier.admit(row_id, prompt, greedy)
        if batch == 1:  # one row at several lengths
            cases = [[n] for n in draft_lengths(k, verifier.compiled_tokens)]
        else:  # how many rows draft k
            drafting = {0, batch} if k else {0}
            if k and verifier.packs:
                drafting.add(1)
            cases = [[k] * rows + [0] * (batch - rows) for rows in sorted(drafting)]
        for lengths in cases:
            times = []
            for _ in range(REPEATS):
                start = time.perf_counter()
                verifier.step({r: prompt[-1] for r in ids}, {r: draft.prefix(n) for r, n in zip(ids, lengths) if n})
                times.append(time.perf_counter() - start)
                for row_id in ids:
                    verifier.truncate(row_id, len(prompt))
            policy.record(StepReport(verify=VerifyTiming(tuple(lengths), float(np.median(times[1:])))))
        for row_id in ids:
            verifier.remove(row_id)
    for name, declared in parts.items():
        if declared.costly is None or not k:
            continue
        drafter, source = drafters[name], declared.source(name)
        for request_id in ("__calibrate", "__calibrate-again"):  # the first request warms up
            drafter.begin(request_id, prompt, greedy)
            for round_ in range(REPEATS):  # the first round catches up on the prompt (priced apart)
                start = time.perf_counter()
                result = declared.costly.propose_costly([request_id], [k])
                [drafted] = result.drafts
                if len(drafted) and request_id != "__calibrate":
                    timing = DraftingTiming(source, len(drafted), time.perf_counter() - start, result.pass_seconds,
                                            result.catch_up.tokens, result.catch_up.seconds)
                    policy.record(StepReport(drafting=(timing,)))
                # As a step that accepts the whole draft: its tokens and the target's next one.
                drafter.accept(request_id, [*drafted.token_ids.tolist(), prompt[round_]])
            drafter.end(request_id)

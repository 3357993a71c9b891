"""Start-up measurements: verify passes at the corners of (batch, width), and each drafter that
drafts only when asked, timed on throwaway rows and reported to the policy, so that its first
choices rest on this machine's costs rather than on guesses. Only steady passes are timed (a static
shape's warm-up and capture are not its cost), and where passes warm up, every width the policy may
choose at the batches calibrated is warmed up here, so that no decode step pays for it; so is every
width a prefill pass runs at (`RowModel.prefill_widths`), so that no request's first token does."""

from __future__ import annotations

import time
from typing import Mapping

import numpy as np

from specdraft.drafters.base import Draft, Drafter, Parts
from specdraft.params import SamplingParams
from specdraft.policy import DraftingTiming, DraftPolicy, StepReport, VerifyTiming
from specdraft.verifier import Verifier

PASSES = (2, 4, 8, 16, 32)  # one row's pass lengths timed besides the plain step and k + 1
REPEATS = 4  # steady timings per case; the first pays one-off allocation and kernel selection and is dropped
WARM_UP = 8  # calls a case may take, besides those, before its passes run steady (a static shape: eager, capture)


def draft_lengths(k: int, compiled_tokens: int) -> list[int]:
    """One row's draft lengths to time: 0, k, and below k the passes of `PASSES` tokens and, where a
    compiled step runs passes of up to `compiled_tokens`, the longest it runs and the next: a pass's
    cost need not be linear in its tokens, and changes regime where the compiled step ends."""
    passes = {*PASSES, *((compiled_tokens, compiled_tokens + 1) if compiled_tokens else ())}
    return sorted({0, k, *(n - 1 for n in passes if n - 1 < k)})


def calibrate(verifier: Verifier, drafters: Mapping[str, Drafter], parts: Mapping[str, Parts], policy: DraftPolicy,
              k: int, max_batch: int) -> None:
    """Time verify steps at the corners of (batch, width) (and, where the verifier packs rows, one row
    drafting k in a full batch: what a few strong drafts cost there) and each drafter's costly part.
    Where a case's passes warmed up, every other draft length up to k is run at that batch until it
    runs steady, untimed."""
    prompt = [int(t) % verifier.vocab_size for t in range(3, 3 + max(32, k + 1))]  # drafts of k fit
    greedy = SamplingParams(max_tokens=4 * (k + 1) + 4)
    draft = Draft(np.asarray(prompt[:k], dtype=np.int32))
    for batch in sorted({1, max_batch}):
        ids = [f"__calibrate-{i}" for i in range(batch)]
        for row_id in ids:
            verifier.admit(row_id, prompt, greedy)
        if batch == 1:  # one row at several lengths; and every prefill width captured now, not in a request
            verifier.warm_prefill(ids[0])
            cases = [[n] for n in draft_lengths(k, verifier.compiled_tokens)]
        else:  # how many rows draft k
            drafting = {0, batch} if k else {0}
            if k and verifier.packs:
                drafting.add(1)
            cases = [[k] * rows + [0] * (batch - rows) for rows in sorted(drafting)]
        warms_up = False
        for lengths in cases:
            drafts = {r: draft.prefix(n) for r, n in zip(ids, lengths) if n}
            times, warmed = _steady_seconds(verifier, ids, prompt, drafts, REPEATS)
            warms_up |= warmed
            if len(times) > 1:
                policy.record(StepReport(verify=VerifyTiming(tuple(lengths), float(np.median(times[1:])))))
        if warms_up:  # the other widths the policy may choose at this batch: warmed up (and captured) now
            timed = {max(lengths) for lengths in cases}
            for n in range(k + 1):
                if n not in timed:
                    _steady_seconds(verifier, ids, prompt, {r: draft.prefix(n) for r in ids if n}, 1)
        for row_id in ids:
            verifier.remove(row_id)
    _calibrate_drafters(drafters, parts, policy, k, prompt, greedy)


def _steady_seconds(verifier: Verifier, ids: list[str], prompt: list[int], drafts: dict[str, Draft],
                    wanted: int) -> tuple[list[float], bool]:
    """Time steps of the rows `ids` (each holding `prompt`) verifying `drafts`, each rolled back after,
    until `wanted` of them ran steady (at most WARM_UP calls more). Returns the steady steps' timings
    and whether any step was not steady (its shape warmed up)."""
    times, warmed = [], False
    for _ in range(wanted + WARM_UP):
        start = time.perf_counter()
        results = verifier.step({r: prompt[-1] for r in ids}, drafts)
        seconds = time.perf_counter() - start
        for row_id in ids:
            verifier.truncate(row_id, len(prompt))
        if not all(result.steady for result in results.values()):
            warmed = True
            continue
        times.append(seconds)
        if len(times) == wanted:
            break
    return times, warmed


def _calibrate_drafters(drafters: Mapping[str, Drafter], parts: Mapping[str, Parts], policy: DraftPolicy, k: int,
                        prompt: list[int], greedy: SamplingParams) -> None:
    """Time each drafter's costly part on a throwaway request (after one that warms it up)."""
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

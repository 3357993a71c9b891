"""Start-up measurements: verify passes at the corners of (batch, width), and each drafter that
drafts only when asked, timed on throwaway rows and reported to the policy, so that its first
choices rest on this machine's costs rather than on guesses. Only steady passes are timed (a static
shape's warm-up and capture are not its cost), and where passes warm up, every width the policy may
choose at the batches calibrated is warmed up here, so that no decode step pays for it; so is every
width a prefill pass runs at (`RowModel.prefill_widths`), so that no request's first token does.

What was measured is kept (`KeptCalibration`: a file under a key naming everything the costs depend
on, this machine, its threads, the models, the settings and the code) and replayed to the policy at
the next start with the same key, where measuring warms nothing up (no static shapes): those passes
cost the same again, and measuring them took most of a start-up."""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Mapping

import numpy as np

from specdraft.drafters.base import Draft, Drafter, Parts
from specdraft.params import SamplingParams
from specdraft.policy import DraftingTiming, DraftPolicy, StepReport, VerifyTiming
from specdraft.verifier import Batch, Verifier

log = logging.getLogger("specdraft")

PASSES = (2, 4, 8, 16, 32)  # one row's pass lengths timed besides the plain step and k + 1
REPEATS = 4  # steady timings per case; the first pays one-off allocation and kernel selection and is dropped
WARM_UP = 8  # calls a case may take, besides those, before its passes run steady (a static shape: eager, capture)


def draft_lengths(k: int, compiled_tokens: int) -> list[int]:
    """One row's draft lengths to time: 0, k, and below k the passes of `PASSES` tokens and, where a
    compiled step runs passes of up to `compiled_tokens`, the longest it runs and the next: a pass's
    cost need not be linear in its tokens, and changes regime where the compiled step ends."""
    passes = {*PASSES, *((compiled_tokens, compiled_tokens + 1) if compiled_tokens else ())}
    return sorted({0, k, *(n - 1 for n in passes if n - 1 < k)})


class KeptCalibration:
    """A calibration's reports kept in the file `path` (JSON: the key's parts, for a reader, and the
    reports): `load` gives them back (None where none are kept, the file is unreadable, or `afresh`
    asks to measure again), `save` writes them (atomically: a start-up that dies midway leaves the
    old file or none)."""

    VERSION = 1

    def __init__(self, path: Path, key: Mapping[str, object], afresh: bool = False) -> None:
        self.path, self.key, self.afresh = path, dict(key), afresh

    def load(self) -> list[StepReport] | None:
        if self.afresh:
            return None
        try:
            kept = json.loads(self.path.read_text())
            if kept.get("version") != self.VERSION:
                return None
            return [_report(entry) for entry in kept["reports"]]
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as exc:  # measured afresh, and written again
            log.warning("the kept calibration %s is unreadable (%s): measuring afresh", self.path, exc)
            return None

    def save(self, reports: list[StepReport]) -> None:
        kept = {"version": self.VERSION, "key": self.key, "reports": [_entry(r) for r in reports]}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            staged = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
            staged.write_text(json.dumps(kept, indent=1))
            staged.replace(self.path)
        except OSError as exc:  # a read-only cache: the next start measures again
            log.warning("could not keep the calibration in %s: %s", self.path, exc)


def _entry(report: StepReport) -> dict:
    """A calibration's report (a verify timing or drafting timings, nothing else) as JSON."""
    assert not report.plans and not report.rows and not report.calls, "a calibration times passes, not steps"
    return {"verify": None if report.verify is None else asdict(report.verify),
            "drafting": [asdict(timing) for timing in report.drafting]}


def _report(entry: dict) -> StepReport:
    verify = entry["verify"]
    return StepReport(verify=None if verify is None else VerifyTiming(tuple(verify["lengths"]), float(verify["seconds"])),
                      drafting=tuple(DraftingTiming(**timing) for timing in entry["drafting"]))


def calibrate(verifier: Verifier, drafters: Mapping[str, Drafter], parts: Mapping[str, Parts], policy: DraftPolicy,
              k: int, max_batch: int, kept: KeptCalibration | None = None) -> bool:
    """Tell the policy this machine's costs: replayed from `kept` where it holds them and measuring
    would warm nothing up (`Verifier.static`: static shapes warm up and capture in these passes),
    else measured (`measure`) and kept there. Returns whether they were measured."""
    reports = kept.load() if kept is not None and not verifier.static else None
    measured = reports is None
    if measured:
        reports = measure(verifier, drafters, parts, k, max_batch)
        if kept is not None:
            kept.save(reports)
    for report in reports:
        policy.record(report)
    return measured


def measure(verifier: Verifier, drafters: Mapping[str, Drafter], parts: Mapping[str, Parts], k: int,
            max_batch: int) -> list[StepReport]:
    """Time verify steps at the corners of (batch, width) (and, where the verifier packs rows, one row
    drafting k in a full batch: what a few strong drafts cost there) and each drafter's costly part.
    Where a case's passes warmed up, every other draft length up to k is run at that batch until it
    runs steady, untimed. Returns what was measured, a report each."""
    reports: list[StepReport] = []
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
            batched = Batch.of(ids, [prompt[-1]] * batch, [draft.prefix(n) for n in lengths])
            times, warmed = _steady_seconds(verifier, batched, len(prompt), REPEATS)
            warms_up |= warmed
            if len(times) > 1:
                reports.append(StepReport(verify=VerifyTiming(tuple(lengths), float(np.median(times[1:])))))
        if warms_up:  # the other widths the policy may choose at this batch: warmed up (and captured) now
            timed = {max(lengths) for lengths in cases}
            for n in range(k + 1):
                if n not in timed:
                    _steady_seconds(verifier, Batch.of(ids, [prompt[-1]] * batch, [draft.prefix(n)] * batch), len(prompt), 1)
        for row_id in ids:
            verifier.remove(row_id)
    return reports + _calibrate_drafters(drafters, parts, k, prompt, greedy)


def _steady_seconds(verifier: Verifier, batch: Batch, length: int, wanted: int) -> tuple[list[float], bool]:
    """Time steps verifying `batch` (its rows each holding a prompt of `length` tokens), each rolled
    back after, until `wanted` of them ran steady (at most WARM_UP calls more). Returns the steady
    steps' timings and whether any step was not steady (its shape warmed up)."""
    times, warmed = [], False
    for _ in range(wanted + WARM_UP):
        start = time.perf_counter()
        steady = verifier.step(batch).steady
        seconds = time.perf_counter() - start
        for row_id in batch.ids:
            verifier.truncate(row_id, length)
        if not steady:
            warmed = True
            continue
        times.append(seconds)
        if len(times) == wanted:
            break
    return times, warmed


def _calibrate_drafters(drafters: Mapping[str, Drafter], parts: Mapping[str, Parts], k: int, prompt: list[int],
                        greedy: SamplingParams) -> list[StepReport]:
    """Time each drafter's costly part on a throwaway request (after one that warms it up)."""
    reports = []
    for name, declared in parts.items():
        if declared.costly is None or not k:
            continue
        drafter, source = drafters[name], declared.source(name)
        for request_id in ("__calibrate", "__calibrate-again"):  # the first request warms up
            # A salt each: the second catches up on the prompt as the first did, not from a prefix cache.
            drafter.begin(request_id, prompt, replace(greedy, cache_salt=request_id))
            for round_ in range(REPEATS):  # the first round catches up on the prompt (priced apart)
                start = time.perf_counter()
                result = declared.costly.propose_costly([request_id], [k])
                [drafted] = result.drafts
                if len(drafted) and request_id != "__calibrate":
                    timing = DraftingTiming(source, len(drafted), time.perf_counter() - start, result.pass_seconds,
                                            result.catch_up.tokens, result.catch_up.seconds)
                    reports.append(StepReport(drafting=(timing,)))
                # As a step that accepts the whole draft: its tokens and the target's next one.
                drafter.accept(request_id, [*drafted.token_ids.tolist(), prompt[round_]])
            drafter.end(request_id)
    return reports

"""What the policy is asked about (`RowPlan`: a row as `DraftPolicy.choose` sees it) and what it is
told once a step is over (`StepReport`: its timings and what each row drafted and accepted)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping


@dataclass(frozen=True)
class RowPlan:
    """One running row as the policy sees it. `source`: where the row's draft would come from (a
    drafter's name, name:kind or name/part; `specdraft.drafters.base.Parts.source`). `cheap`: its
    draft was already proposed (`avail` tokens), else a costly part drafts it once its length is
    chosen. `fixed`: its request drafts all it can every step (the `fixed` policy)."""

    request_id: str
    source: str
    limit: int  # the longest draft this row may verify now (its k, its budget)
    cheap: bool
    avail: int  # cheap: the proposed draft's length; otherwise == limit
    backlog: int = 0  # costly: context tokens its drafter must catch up on before drafting this row
    remaining: int = 1  # tokens the row may still generate (the catch-up is an investment in them) ...
    fixed: bool = False
    generated: int = 0  # ... after these (how long replies run says how many it likely will: `lengths.py`)


@dataclass(frozen=True)
class Verified:
    """One row of a verify pass: `drafted` tokens from `source`, the first `accepted` of them
    accepted; `tokens` it emitted; `unverified`: a free draft the step left out (checked for free
    against the tokens the row emits)."""

    request_id: str
    source: str
    drafted: int
    accepted: int
    tokens: tuple[int, ...] = ()
    unverified: tuple[int, ...] = ()


@dataclass(frozen=True)
class VerifyTiming:
    """A verify pass over rows with these draft lengths (one per row) took `seconds`. `steady`: the
    pass ran at its shape's steady cost; one that warmed its shape up or captured it is no cost of
    the shape (the policy ignores it)."""

    lengths: tuple[int, ...]
    seconds: float
    steady: bool = True


@dataclass(frozen=True)
class CallTiming:
    """A measured drafter's call took `seconds` and proposed drafts of these lengths, by request."""

    drafter: str
    proposed: Mapping[str, int]
    seconds: float


@dataclass(frozen=True)
class DraftingTiming:
    """A costly part drafted up to `positions` tokens a row in `seconds`; `pass_seconds`: its own
    timing of one drafting pass (None: not measured); its catching up on rows it had sat out apart."""

    source: str
    positions: int
    seconds: float
    pass_seconds: float | None = None
    catch_up_tokens: int = 0
    catch_up_seconds: float = 0.0


@dataclass(frozen=True)
class StepReport:
    """What one step did, as the policy learns from it. `plans`: the rows `choose` was asked about
    (none: a measurement outside a decode step, e.g. calibration); `rows`: the rows it verified;
    `asked`: the measured drafters `worth_calling` was asked about, and whether each was called;
    `other_seconds`: the step's host work besides verifying and drafting."""

    plans: tuple[RowPlan, ...] = ()
    rows: tuple[Verified, ...] = ()
    verify: VerifyTiming | None = None
    asked: Mapping[str, bool] = field(default_factory=dict)
    calls: tuple[CallTiming, ...] = ()
    drafting: tuple[DraftingTiming, ...] = ()
    other_seconds: float | None = None

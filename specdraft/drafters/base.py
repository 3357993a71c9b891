"""The drafter contract: everything the engine asks of a drafter, and the values it gets back.

A drafter is four verbs (`Drafter`). Lifecycle per request: `begin` with the prompt, then each step
`propose` (batched over the active requests) and `accept` with the tokens that joined the context,
and finally `end`. A drafter learns how much of its draft was accepted by comparing what it proposed
with what `accept` receives. A drafter that implements only these works as it is: the engine asks it
for full-length drafts before each step's lengths are chosen, times each call, and the cost-aware
policy (`specdraft.policy`) skips calling it in steps where what its drafts are expected to gain
does not pay for the measured time of the call.

A drafter may declare more, as data (`DeclaresParts.parts`, a `Parts` value), and nothing else is
ever asked of it:
- that its drafts are *free* (microseconds: `ngram`, `none`), so the policy never weighs calling it;
- a *costly part* (`CostlyPart`): drafts only when asked, each draft position a forward pass (a
  draft model), so the engine asks it only after the policy has chosen each row's length. It says
  what it must catch up on before drafting a row (`backlog`) and returns its drafts with what they
  cost (`CostlyDrafts`), as values;
- both: a free part that drafts where it can and a costly part for the other rows (`hybrid`);
- that its costly part is a copy of the target (`self-int8`): its keys and values mean what the
  target's do, so it takes the target's for context it has not computed instead of catching up on
  it (`SharesTargetCache`; the engine hands it the target's rows once).
`parts_of` is the one place a drafter's declaration is read.

What one runtime's drafters share (a draft model loaded once, one cross-request memory, how models
run there) reaches a factory that declares a `resources` parameter (`Resources`; the registry,
`specdraft.drafters.registry`, hands it over).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Callable, Hashable, Protocol, Sequence, TypeVar, runtime_checkable

from specdraft.draft import EMPTY_DRAFT, Draft  # noqa: F401 - part of the contract a drafter reads here
from specdraft.params import SamplingParams

if TYPE_CHECKING:  # the protocol module stays light: listing drafters must not import torch
    from specdraft.backend import RowModel, StaticShapes

T = TypeVar("T")


class Proposer(Protocol):
    def propose(self, request_ids: Sequence[str], max_lengths: Sequence[int]) -> list[Draft]:
        """One draft per request, each at most `max_lengths[i]` tokens (0 allowed: plain step)."""


@runtime_checkable
class Drafter(Proposer, Protocol):
    """Proposes continuations; never sees logits of the target and never changes the output."""

    def begin(self, request_id: str, prompt_ids: Sequence[int], params: SamplingParams) -> None:
        """Start tracking a request whose context is `prompt_ids`."""

    def accept(self, request_id: str, token_ids: Sequence[int]) -> None:
        """Tokens that joined the request's context this step (accepted draft + target token)."""

    def end(self, request_id: str) -> None:
        """Forget the request; called exactly once, also for requests that were cancelled."""


@dataclass(frozen=True)
class CatchUp:
    """Context tokens a costly part fed, in passes of their own, to rows it had sat out."""

    tokens: int = 0
    seconds: float = 0.0


@dataclass(frozen=True)
class CostlyDrafts:
    """A costly part's drafts (one per request asked) and what they cost. `pass_seconds`: one drafting
    pass (one position for every drafting row), catching up left out (None: not measured; the call's
    time is used); `catch_up`: what the call spent catching up, priced apart by the policy."""

    drafts: list[Draft]
    pass_seconds: float | None = None
    catch_up: CatchUp = CatchUp()


class CostlyPart(Protocol):
    """Drafts only when asked, each draft position costing a forward pass."""

    def backlog(self, request_id: str) -> int:
        """Context tokens it must catch up on before it can draft this row (0: none)."""

    def propose_costly(self, request_ids: Sequence[str], max_lengths: Sequence[int]) -> CostlyDrafts:
        """Drafts of up to `max_lengths[i]` tokens each, with their cost."""


class SharesTargetCache(Protocol):
    """A costly part declared a copy of the target (`Parts.target_cache`)."""

    def share_target(self, rows: RowModel) -> None:
        """The target's rows (`specdraft.backend.RowModel`, keyed by request id), whose committed
        keys and values it may copy for the context it lacks; called once, before any request."""


class Cost(StrEnum):
    """What calling a free part costs the policy: FREE nothing (microseconds), MEASURED its timed calls."""

    FREE = "free"
    MEASURED = "measured"


def drafter_failure(name: str, exc: Exception) -> str:
    """Why a request fails when its drafter raises (a drafter's fault ends its own requests only)."""
    return f"drafter {name!r} failed: {type(exc).__name__}: {exc}"


@dataclass(frozen=True)
class Parts:
    """How the engine asks a drafter for drafts, and how the policy prices them.

    free: asked first each step, at full length, so the policy sees each row's draft before choosing
    lengths (its drafts are trimmed to them); `free_cost` "free" costs nothing to the policy,
    "measured" is timed per call and called only where it pays. costly: asked afterwards, for the
    rows without a free draft, at the chosen lengths; `costly_name` names it in the policy's sources
    (`hybrid/model`) when the drafter also has a free part. forced_tokens: for a request with a
    response format (`specdraft.grammar`), the engine cuts every draft at its first token the
    grammar forbids and appends the tokens the grammar forces after it (free, and drafted where the
    drafter has nothing); False declines the forced tokens (`none`, which is plain decoding).
    target_cache: the costly part is a copy of the target and implements `SharesTargetCache`. Lifecycle
    calls (`begin`, `accept`, `end`) always go to the drafter itself, which forwards them to its parts.
    """

    free: Proposer | None
    free_cost: Cost = Cost.MEASURED
    costly: CostlyPart | None = None
    costly_name: str = "costly"
    forced_tokens: bool = True
    target_cache: bool = False

    def __post_init__(self) -> None:
        assert self.free is not None or self.costly is not None, "a drafter needs a part that drafts"
        object.__setattr__(self, "free_cost", Cost(self.free_cost))  # a declaration may spell it as a string
        assert not self.target_cache or self.costly is not None, "only a costly part shares the target's cache"

    def source(self, drafter: str, draft: Draft | None = None) -> str:
        """Where a draft of the drafter named `drafter` comes from, as the cost-aware policy keeps its
        estimates and costs apart: the free part's `draft` is `drafter`, or `drafter:kind` for a draft
        of a kind; the costly part's (no draft yet) is `drafter`, or `drafter/costly_name` beside a
        free part."""
        if draft is None:
            return drafter if self.free is None else f"{drafter}/{self.costly_name}"
        return f"{drafter}:{draft.kind}" if draft.kind else drafter


@runtime_checkable
class DeclaresParts(Protocol):
    """A drafter that declares its parts (the built-in drafters do)."""

    parts: Parts


def parts_of(drafter: Drafter) -> Parts:
    """The drafter's declared parts; one that declares none is a single measured part: itself."""
    if isinstance(drafter, DeclaresParts):
        return drafter.parts
    return Parts(free=drafter, free_cost=Cost.MEASURED)


class Resources:
    """What the drafters one runtime builds share: the draft model the runtime loaded for `model` and
    every drafter built on it (`draft`: a `models.LoadedModel`, its `model`, `compute_dtype` and
    `target_copy` read; None where none was asked for), one of each other thing they ask for by key
    (`shared`: one cross-request n-gram memory), how the runtime runs models (`static_shapes`: CUDA
    graphs' shapes, None off CUDA; `compiled`: the compiled CPU step where it pays), and what must be
    saved before the runtime stops (`on_save`)."""

    def __init__(self, static_shapes: StaticShapes | None = None, compiled: bool = False, draft: Any = None) -> None:
        self.static_shapes, self.compiled, self.draft = static_shapes, compiled, draft
        self._shared: dict[Hashable, Any] = {}
        self._saves: list[Callable[[], None]] = []

    def shared(self, key: Hashable, make: Callable[[], T]) -> T:
        """The one value kept under `key`, made by `make` the first time it is asked for."""
        if key not in self._shared:
            self._shared[key] = make()
        return self._shared[key]

    def on_save(self, save: Callable[[], None]) -> None:
        """Call `save` whenever the runtime saves its drafters' state (periodically, and as it stops)."""
        self._saves.append(save)

    @property
    def saves(self) -> bool:
        return bool(self._saves)

    def save(self) -> None:
        for save in self._saves:
            save()

"""The `model` drafter's rows of its draft model, on tiny Llama pairs built in-process: it catches up
without re-running its prompt, its passes after a draft's first feed the drafting rows alone, a copy
of the target copies the target's keys and values instead of catching up (same drafts, engines share
the target's rows with it), and its prefix cache and window leave the output the target's."""

from __future__ import annotations

import numpy as np
import pytest

from specdraft.drafters import create_drafter
from specdraft.drafters.hybrid import HybridDrafter
from specdraft.drafters.model import SINK, ModelDrafter
from specdraft.drafters.ngram import NgramDrafter
from specdraft.engine import Engine
from specdraft.params import SamplingParams, SpeculationParams
from specdraft.verifier import Batch, Verifier
from tests.helpers.pairs import K, PROMPTS
from tests.helpers.tiny import ToyTokenizer, hf_greedy, loaded, make_tiny_model, shallow_copy_of


def test_catching_up_never_reruns_the_prompt(pair):
    """Steps without drafting leave the drafter behind; its next draft is still exactly the draft
    model's greedy continuation, and it fed every context token once (plus its own drafts)."""
    target, draft = pair
    drafter = ModelDrafter(draft, k=K)
    prompt = list(range(1, 40))  # longer than the drafter's lag limit: catches up in its own pass
    drafter.begin("r", prompt, SamplingParams())
    context = list(prompt)
    fed_drafts = 0
    for step in range(6):
        if step in (0, 1, 4, 5):
            [d] = drafter.propose(["r"], [K])
            assert d.token_ids.tolist() == hf_greedy(draft, context, K)
            fed_drafts += len(d) - 1
            new = d.token_ids[:2].tolist() + [7]  # two accepted, then a "recovered" token
        else:
            [d] = drafter.propose(["r"], [0])  # not asked to draft: nothing runs
            assert len(d) == 0
            new = [3, 3]
        drafter.accept("r", new)
        context += new
    assert drafter.rows.committed_tokens <= len(context) + fed_drafts


def test_drafting_passes_feed_the_drafting_rows_alone(pair):
    """The passes after a draft's first feed only the rows still drafting (packed, by their counts): a
    row that is not asked to draft takes no part in them, and the draft is still the draft model's
    greedy continuation."""
    target, draft = pair
    drafter = ModelDrafter(draft, k=K)
    prompts = {"a": [5, 17, 42, 9, 9, 13], "b": [1, 2, 3, 4, 5, 6, 7]}
    for row_id, prompt in prompts.items():
        drafter.begin(row_id, prompt, SamplingParams())
    feeds, packed_pass = [], drafter.rows.packed_pass

    def recorded(window, tokens, fed, last=False):
        feeds.append(np.asarray(fed).tolist())
        return packed_pass(window, tokens, fed, last)

    drafter.rows.packed_pass = recorded
    [a, b] = drafter.propose(["a", "b"], [K, 0])
    assert a.token_ids.tolist() == hf_greedy(draft, prompts["a"], K) and len(b) == 0
    slot_a = drafter.rows.slot("a")
    assert len(feeds) == K and feeds[0][slot_a] >= 1
    assert all(fed[slot_a] == 1 and sum(fed) == 1 for fed in feeds[1:])


def test_a_copy_of_the_target_takes_its_keys_and_values_instead_of_catching_up():
    """A draft declared a copy of the target (here the target itself, so that entries are equal)
    copies the target's committed keys and values for a new prompt and for steps it sat out: it
    feeds no context in passes of its own, owes no backlog, and drafts exactly what a drafter that
    computed everything itself drafts."""
    target = make_tiny_model(seed=21, layers=2, sharpen=12.0)
    verifier = Verifier(target)
    shared, alone = ModelDrafter(target, k=K, target_copy=True), ModelDrafter(target, k=K)
    assert shared.parts.target_cache and not alone.parts.target_cache
    shared.share_target(verifier.rows)
    prompt = list(range(3, 43))  # longer than the lag limit: `alone` catches up in passes of its own
    context = prompt + [verifier.admit("r", prompt, SamplingParams())]
    for drafter in (shared, alone):
        drafter.begin("r", prompt, SamplingParams())
        drafter.accept("r", context[len(prompt):])
    assert shared.backlog("r") == 0 and alone.backlog("r") > 0
    for step in range(4):
        if step == 2:  # a step without drafting: the verifier decodes on, the drafters fall behind
            for _ in range(K + 2):
                token = verifier.step(Batch.of(["r"], [context[-1]], [None])).emitted(0)
                context += token
                for drafter in (shared, alone):
                    drafter.accept("r", token)
            continue
        results = [d.propose_costly(["r"], [K]) for d in (shared, alone)]
        assert results[0].catch_up.tokens == 0
        assert results[0].drafts[0].token_ids.tolist() == results[1].drafts[0].token_ids.tolist()
        draft = results[0].drafts[0]
        emitted = verifier.step(Batch.of(["r"], [context[-1]], [draft])).emitted(0)
        context += emitted
        for drafter in (shared, alone):
            drafter.accept("r", emitted)
    assert shared.rows.committed_tokens < alone.rows.committed_tokens - len(prompt)
    with pytest.raises(ValueError, match="not a copy"):
        ModelDrafter(shallow_copy_of(target, keep=[0]), k=K, target_copy=True).share_target(verifier.rows)


def test_engines_share_the_targets_rows_with_a_self_copy_drafter(pair):
    target, _ = pair
    shared = ModelDrafter(target, k=K, target_copy=True)
    engine = Engine(Verifier(target), {"model": shared}, ToyTokenizer(), (), 256, k=K, max_batch=2)
    assert shared._target is engine.verifier.rows
    for prompt in PROMPTS[:3]:
        [done] = engine.run([(prompt + prompt, SamplingParams(max_tokens=25), SpeculationParams("model"))])
        assert done.token_ids == hf_greedy(target, prompt + prompt, 25)


def test_a_prompt_that_starts_as_an_ended_one_catches_up_on_its_new_tokens_only(pair):
    """The drafter keeps ended requests' keys and values per cache salt (`prefix_cache_bytes`): a later
    request whose prompt starts alike (an agent's next turn) reads them and feeds only what is new,
    and its drafts are the draft model's greedy continuation all the same; another salt reads nothing."""
    target, draft = pair
    drafter = ModelDrafter(draft, k=K, prefix_cache_bytes=1 << 20)
    first = list(range(1, 40))
    drafter.begin("turn 1", first, SamplingParams())
    [d] = drafter.propose(["turn 1"], [K])
    drafter.accept("turn 1", [int(d.token_ids[0]), 5])  # one accepted, then a recovered token
    context = first + [int(d.token_ids[0]), 5]
    [pending] = drafter.propose(["turn 1"], [K])  # a draft fed and not yet accepted when the request ends
    drafter.end("turn 1")
    fed = drafter.rows.committed_tokens
    second = context + [11, 12, 13]
    drafter.begin("turn 2", second, SamplingParams())
    assert drafter.rows.length("turn 2") == len(context)  # the ended request's context, not its pending draft
    [d] = drafter.propose(["turn 2"], [K])
    assert d.token_ids.tolist() == hf_greedy(draft, second, K)
    assert drafter.rows.committed_tokens - fed == 3 + len(d) - 1  # the new tokens and the draft's own
    drafter.begin("other salt", second, SamplingParams(cache_salt="other"))
    assert drafter.rows.length("other salt") == 0
    assert len(pending) > 0


def test_the_model_drafters_prefix_cache_is_an_option(pair):
    target, draft = pair
    on = create_drafter("model", k=K, target=loaded(target), draft_model=loaded(draft))
    off = create_drafter("model", k=K, target=loaded(target), draft_model=loaded(draft), prefix_cache_mb=0)
    assert on.prefixes is not None and on.prefixes.budget == 256 << 20 and off.prefixes is None
    with pytest.raises(ValueError, match="prefix_cache_mb must be an integer >= 0, got -1"):
        create_drafter("model", k=K, target=loaded(target), draft_model=loaded(draft), prefix_cache_mb=-1)


def test_a_row_far_behind_catches_up_on_its_window_only(pair):
    """With a window, a row further behind than it feeds the context's first SINK tokens and its last
    `window` ones (a gap between): its drafts are the draft model's greedy continuation of exactly
    those tokens, the backlog the policy prices is theirs, and a row left behind again later keeps
    its first tokens and takes the newest `window` ones."""
    target, draft = pair
    window = 16
    drafter = ModelDrafter(draft, k=K, window=window)
    prompt = list(range(1, 60))
    drafter.begin("r", prompt, SamplingParams())
    assert drafter.backlog("r") == SINK + window
    [d] = drafter.propose(["r"], [K])
    seen = prompt[:SINK] + prompt[-window:]
    assert d.token_ids.tolist() == hf_greedy(draft, seen, K)
    assert drafter.rows.committed_tokens == len(seen) + K - 1
    new = d.token_ids[:2].tolist() + [7]
    drafter.accept("r", new)
    context, seen = prompt + new, seen + new
    [d] = drafter.propose(["r"], [K])  # close behind: its drafting pass feeds what it missed
    assert d.token_ids.tolist() == hf_greedy(draft, seen, K)
    drafter.accept("r", [3] * 30)  # steps without drafting: far behind again
    context += [3] * 30
    assert drafter.backlog("r") == window
    [d] = drafter.propose(["r"], [K])
    assert d.token_ids.tolist() == hf_greedy(draft, context[:SINK] + context[-window:], K)


def test_a_window_leaves_the_output_the_targets(pair):
    target, draft = pair
    drafters = {"none": create_drafter("none"), "model": ModelDrafter(draft, k=K, window=12),
                "hybrid": HybridDrafter(NgramDrafter(k=K), ModelDrafter(draft, k=K, window=12), min_match=3)}
    engine = Engine(Verifier(target), drafters, ToyTokenizer(), (), 256, k=K, max_batch=4, policy="fixed")
    prompts = [list(range(1, 50)), [5, 17, 42, 9, 9, 13] * 8, PROMPTS[1]]
    requests = [(p, SamplingParams(max_tokens=30), SpeculationParams(d)) for p in prompts for d in ("model", "hybrid")]
    for (prompt, params, _), done in zip(requests, engine.run(requests)):
        assert done.token_ids == hf_greedy(target, prompt, 30)
        assert done.metrics.draft_tokens > 0


def test_a_conversations_next_turn_reads_its_row_with_the_gap(pair):
    """A row that caught up with a gap is kept in the prefix cache as the tokens it holds; the same
    salt's next turn (its prompt the first turn's context and more) reads it, gap and all, and feeds
    only its new tokens; a prompt that does not go on from it reads a plain prefix instead."""
    target, draft = pair
    window = 16
    drafter = ModelDrafter(draft, k=K, prefix_cache_bytes=1 << 20, window=window)
    first = list(range(1, 60))
    drafter.begin("turn 1", first, SamplingParams())
    [d] = drafter.propose(["turn 1"], [K])
    drafter.accept("turn 1", [int(d.token_ids[0]), 5])
    context = first + [int(d.token_ids[0]), 5]
    drafter.end("turn 1")
    held = first[:SINK] + context[-window - 2 : -1]  # what the row held: sinks, window, the accepted draft token
    fed = drafter.rows.committed_tokens
    second = context + [11, 12, 13]
    drafter.begin("turn 2", second, SamplingParams())
    assert drafter.rows.length("turn 2") == len(held)
    assert drafter.backlog("turn 2") == 0  # 4 new tokens: the drafting pass feeds them
    [d] = drafter.propose(["turn 2"], [K])
    assert d.token_ids.tolist() == hf_greedy(draft, held + [5, 11, 12, 13], K)
    assert drafter.rows.committed_tokens - fed == 4 + len(d) - 1
    # A prompt that parts from the first turn before its gap: the plain prefix stored, the sinks.
    drafter.begin("elsewhere", first[:30] + [40] * 40, SamplingParams())
    assert drafter.rows.length("elsewhere") == SINK and drafter.backlog("elsewhere") == window


def test_the_model_drafters_window_is_an_option(pair):
    target, draft = pair
    made = create_drafter("model", k=K, target=loaded(target), draft_model=loaded(draft))
    assert made.window == 512
    assert create_drafter("model", k=K, target=loaded(target), draft_model=loaded(draft), window=None).window is None
    for bad in (10, 0):
        with pytest.raises(ValueError, match=r"window must be an integer above 10 \(2k \+ 2\) tokens"):
            create_drafter("model", k=K, target=loaded(target), draft_model=loaded(draft), window=bad)
    for bad in ("64", True):  # refused by the options' type check first
        with pytest.raises(ValueError, match=r"option 'window' must be an integer or None"):
            create_drafter("model", k=K, target=loaded(target), draft_model=loaded(draft), window=bad)

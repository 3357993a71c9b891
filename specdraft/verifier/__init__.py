"""The shared batched verifier: one target forward pass checks the drafts of every active row.

Terms, used the same way everywhere in specdraft:

- **draft** `d1..dk`: tokens a drafter proposed after the row's last token; `q` is the distribution
  they were drawn from (one-hot at `di` for deterministic drafters).
- **accepted**: the leading draft tokens the target agrees with. Greedy: `di == argmax p_i`.
  Sampling: `di` is accepted with probability `min(1, p_i(di) / q_i(di))`. For a deterministic
  draft (q one-hot, so that probability is `p_i(di)`) the test is `di == y_i`, where `y_i` is the
  target's own draw from `p_i` with the row's keyed uniform for that position.
- **rejected**: the first draft token that is not accepted; it and everything after it is dropped.
- **recovered** token: emitted in place of a rejected one. Greedy: `argmax p_i`. Sampling: drawn from
  `norm(max(0, p_i - q_i))`; for a deterministic draft that draw is `y_i` itself.
- **bonus** token: emitted after a fully accepted draft (or an empty one): `argmax p_{k+1}`, or `y_{k+1}`.

- **constrained** row (structured output, `specdraft.grammar`): at every position it decides, the
  target's logits of the tokens its grammar forbids are -inf before any of the above; its drafts
  arrive cut at their first illegal token and are tested as deterministic drafts.

- **logprobs** of an emitted token: the log-softmax of the target's raw logits at the position that
  decided it (before temperature, top-k, top-p and masks), for rows that ask (`verifier.logprobs`).

Each step emits `accepted + 1` tokens per row: the accepted prefix and one recovered or bonus token.
This makes greedy output identical to the target alone and sampled output distributed exactly as
the target's (Leviathan et al. 2023, Theorem 1). With deterministic drafters (`none`, `ngram`) a
seeded sampled row emits exactly the tokens plain sampling with the same seed emits, in any batch.
"""

from specdraft.verifier.batch import Batch, Verdict
from specdraft.verifier.verifier import Verifier

__all__ = ["Batch", "Verdict", "Verifier"]

"""Emitted tokens' log-probabilities under the target: the log-softmax of its raw float32 logits at
the position that decided each token (before temperature, top-k, top-p and grammar masks: vLLM's
"raw logprobs"), so that they describe the model, not the request's sampling. Gathered on the device
for the rows that ask (`SamplingParams.logprobs`) and packed into the step's one device-to-host
transfer (`pack_logprobs`, then `unpack_logprobs` on the host). Each position is reduced on its own
(a row-wise log-softmax), so a token's values depend on its logits only, not on the pass, the batch
or the draft that carried it: they are bitwise a plain step's where its logits are."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from specdraft.results import TokenLogprob


def pack_logprobs(logits: torch.Tensor, tokens: torch.Tensor, top: int) -> torch.Tensor:
    """The log-probabilities of `tokens` and of the `top` most likely tokens at each position, as one
    int64 tensor [positions, 1 + 2 top]: (token's logprob, top ids, top logprobs), each float32
    logprob carried by its bits (so that it travels with the step's token ids, bit for bit).

    logits: [positions, vocab] raw logits of the positions of the rows that ask; tokens: [positions]
    the tokens emitted there (a position past what its row emitted is not read)."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)  # [positions, vocab]
    chosen = logprobs.gather(1, tokens.clamp(min=0)[:, None])  # [positions, 1]
    if not top:
        return chosen.view(torch.int32).to(torch.int64)
    values, ids = logprobs.topk(top, dim=-1)  # [positions, top], most likely first
    bits = torch.cat([chosen, values], dim=-1).view(torch.int32).to(torch.int64)  # [positions, 1 + top]
    return torch.cat([bits[:, :1], ids, bits[:, 1:]], dim=-1)


def unpack_logprobs(packed: np.ndarray, tokens: np.ndarray, offsets: np.ndarray, counts: Sequence[int],
                    tops: Sequence[int]) -> list[list[TokenLogprob]]:
    """`pack_logprobs`'s host copy [positions, 1 + 2 top] as each row's first counts[i] tokens' entries
    (row i's positions start at offsets[i]), each with its own tops[i] <= top most likely tokens.
    tokens: [positions] the tokens emitted."""
    top = (packed.shape[-1] - 1) // 2
    floats = packed.astype(np.int32).view(np.float32)  # the bits back as float32
    out = []
    for start, count, n in zip(offsets.tolist(), counts, tops):
        span = slice(start, start + int(count))
        ids, values = packed[span, 1 : 1 + n].tolist(), floats[span, 1 + top : 1 + top + n].tolist()
        out.append([TokenLogprob(int(token), float(value), tuple(zip(i, v)))
                    for token, value, i, v in zip(tokens[span].tolist(), floats[span, 0].tolist(), ids, values)])
    return out

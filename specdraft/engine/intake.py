"""Intake: where a request is checked, once, whoever submits it (library, CLI, server), and resolved
into the value the engine takes as it is (`ResolvedRequest`, vLLM's `Request` and nanochat's row
state are the models): its id, its token limit, its compiled grammar, its drafter object with the
drafter's declared parts, its longest draft and its policy. Nothing below intake checks a request
again or looks a drafter up by name.

The room rule lives here alone: a prompt must leave room to generate, and a `max_tokens` that does
not fit in the context with the prompt is refused, as OpenAI refuses it (`context_length_exceeded`);
a request that names no `max_tokens` may generate what fits.
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Mapping, Sequence

from specdraft.drafters.base import Drafter, Parts
from specdraft.engine import constrain
from specdraft.engine.requests import ResolvedRequest
from specdraft.errors import RequestError
from specdraft.grammar import GrammarCompiler
from specdraft.params import Policy, SamplingParams, SpeculationParams


class Intake:
    """An engine's fixed configuration, as a request is checked against it: the vocabulary, the
    context, the drafters (by name, with their parts) and their defaults, the grammar compiler and
    whether an end-of-sequence token exists. Reads only what never changes (the grammar compiler
    locks; ids come from one counter): safe from any thread."""

    def __init__(self, vocab_size: int, max_context: int, drafters: Mapping[str, Drafter], parts: Mapping[str, Parts],
                 default_drafter: str, k: int, policy: Policy, grammar: GrammarCompiler | None, has_eos: bool) -> None:
        self.vocab_size, self.max_context, self.drafters, self.parts = vocab_size, max_context, drafters, parts
        self.default_drafter, self.k, self.policy = default_drafter, k, policy
        self.grammar, self.has_eos = grammar, has_eos
        self._ids = itertools.count()

    def resolve(self, prompt_ids: Sequence[int], params: SamplingParams, speculation: SpeculationParams | None = None,
                prompt_param: str = "prompt") -> ResolvedRequest:
        """The request resolved, or RequestError naming what this engine cannot serve: an empty prompt,
        a token id outside the vocabulary, what the context cannot hold, a drafter or draft length it
        lacks, a response format it cannot compile. `prompt_param`: the request field the prompt came
        from, as errors name it."""
        prompt = tuple(int(t) for t in prompt_ids)
        self._check_prompt(prompt, prompt_param)
        params = replace(params, max_tokens=self.limit(len(prompt), params.max_tokens, prompt_param))
        speculation = speculation or SpeculationParams()
        name = speculation.drafter or self.default_drafter
        if name not in self.drafters:
            raise RequestError(f"drafter {name!r} is not available here; choose one of: "
                               f"{', '.join(sorted(self.drafters))}", param="speculation")
        k = self.k if speculation.num_speculative_tokens is None else speculation.num_speculative_tokens
        if k > self.k:
            raise RequestError(f"num_speculative_tokens {k} is above this engine's maximum of {self.k}",
                               param="speculation")
        grammar = None if params.response_format is None else constrain.grammar_of(self.grammar, params, self.has_eos)
        return ResolvedRequest(f"req-{next(self._ids)}", prompt, params, name, self.drafters[name], self.parts[name],
                               k, speculation.policy or self.policy, grammar)

    def _check_prompt(self, prompt: tuple[int, ...], param: str) -> None:
        if not prompt:
            raise RequestError("prompt is empty: give at least one token", param=param)
        bad = next((t for t in prompt if not 0 <= t < self.vocab_size), None)
        if bad is not None:
            raise RequestError(f"token id {bad} is outside the vocabulary (0..{self.vocab_size - 1})", param=param)

    def limit(self, prompt_tokens: int, max_tokens: int | None, prompt_param: str = "prompt") -> int:
        """The one room rule: the tokens a request of `prompt_tokens` may generate, `max_tokens` where it
        fits in the context with the prompt, what fits where it names none; RequestError (code
        `context_length_exceeded`) where the prompt leaves no room or `max_tokens` does not fit."""
        room = self.max_context - prompt_tokens
        if room < 1:
            raise RequestError(f"the prompt has {prompt_tokens} tokens; this model's context is {self.max_context} "
                               "tokens, leaving no room to generate", param=prompt_param, code="context_length_exceeded")
        if max_tokens is None:
            return room
        if max_tokens > room:
            raise RequestError(f"max_tokens is {max_tokens}, but the prompt has {prompt_tokens} tokens and this "
                               f"model's context is {self.max_context}: at most {room} tokens can be generated",
                               param="max_tokens", code="context_length_exceeded")
        return max_tokens

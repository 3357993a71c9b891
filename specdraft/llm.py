"""The library front door: `LLM` decodes prompts in-process on one engine, assembled by
`build_runtime` as the server's is, in the shape vLLM's users know.

    llm = LLM()  # the embedded model; LLM(model=..., drafters=["none", "ngram"], k=5, policy="fixed", ...)
    outs = llm.generate(["prompt a", "prompt b"], SamplingParams(max_tokens=64), SpeculationParams("ngram"))
    outs = llm.chat([{"role": "user", "content": "..."}])
    for delta in llm.stream("prompt"):
        print(delta.text, end="")

`generate` (raw text or token ids, no chat template) and `chat` (messages, chat template applied)
decode all their prompts together, by continuous batching on the one engine, and return one
`RequestOutput` per prompt, in order: the engine's `Completion` (text, token_ids, prompt_token_ids,
finish_reason, error, logprobs, and `metrics`, the request's `RequestMetrics`: steps, draft_tokens,
accepted_tokens, acceptance_rate, tokens_per_second, ...); `stream` yields one request's `Delta`s as
steps produce them.
Every prompt is checked before any is submitted, once, by the engine's intake (`Engine.resolve`): bad
input raises `RequestError` (a ValueError) naming the problem (text that is not valid Unicode, such as
a lone surrogate, names where: `specdraft.text.check_unicode`); a `max_tokens` that does not fit in
the context with the prompt is refused (code "context_length_exceeded"), and None generates what fits. A request whose drafter fails ends with finish_reason "error" and its `error`;
the others finish as usual. A step that raises (a fault of the engine itself) raises from the call,
after that call's requests are cancelled.

One `LLM` is not thread-safe: each call drives the engine on the calling thread. Use it from one
thread; to serve several, run the engine on a thread of its own, as the server does
(`specdraft.service.EngineService`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Generator, Mapping, Sequence
from numbers import Integral
from typing import Any

from specdraft.engine import Completion, Delta, ResolvedRequest
from specdraft.errors import RequestError
from specdraft.models import LoadedModel
from specdraft.params import SamplingParams, SpeculationParams
from specdraft.runtime import build_runtime, encode_prompt
from specdraft.settings import Settings
from specdraft.text import check_unicode

Prompt = str | Sequence[int]  # raw text, or token ids (vLLM's token prompts)
Conversation = Sequence[Mapping[str, Any]]  # chat messages: {"role": ..., "content": ...}
PerPrompt = SamplingParams | SpeculationParams | Sequence[Any] | None  # one for all prompts, or one each

RequestOutput = Completion  # a finished request, by the name vLLM's users know


class LLM:
    """model: a name or path as the CLI takes it (default: the embedded model), or a `LoadedModel`
    already loaded; settings: the engine's (`Settings`, default `Settings()`); options: `Settings` fields
    by name, over `settings` (`LLM(model, drafters=["none", "ngram"], k=4)`).
    `runtime` holds what was built (`runtime.skipped`: drafter plugins that failed to build)."""

    def __init__(self, model: str | LoadedModel | None = None, settings: Settings | None = None, **options: Any) -> None:
        if settings is not None and not isinstance(settings, Settings):
            raise TypeError(f"settings must be a Settings, got {type(settings).__name__}")
        self.runtime = build_runtime(model, (settings or Settings()).replace(**options))
        self.engine = self.runtime.engine
        self.tokenizer = self.runtime.target.tokenizer
        self._live: set[str] = set()  # requests submitted here and not finished
        self._streamed: dict[str, deque[Delta]] = {}  # deltas of a request being streamed, not yet yielded

    # -- calls ---------------------------------------------------------------------------------
    def generate(self, prompts: Prompt | Sequence[Prompt], sampling_params: PerPrompt = None,
                 speculation_params: PerPrompt = None) -> list[Completion]:
        """Complete raw text or token ids (one prompt or a list), no chat template. Each params
        argument is one value for every prompt or a list of one per prompt; speculation None is the
        engine's default drafter, draft length and policy."""
        many = _is_list(prompts) and not (len(prompts) and _is_token_ids(prompts))
        prompt_ids = self._encode_all(list(prompts) if many else [prompts], chat=False)
        return self._decode(self._requests(prompt_ids, sampling_params, speculation_params))

    def chat(self, messages: Conversation | Sequence[Conversation], sampling_params: PerPrompt = None,
             speculation_params: PerPrompt = None) -> list[Completion]:
        """Answer one conversation or a list of them, each with the model's chat template applied."""
        many = _is_list(messages) and not _is_conversation(messages)
        prompt_ids = self._encode_all(list(messages) if many else [messages], chat=True)
        return self._decode(self._requests(prompt_ids, sampling_params, speculation_params))

    def stream(self, prompt: Prompt | Conversation, sampling_params: SamplingParams | None = None,
               speculation_params: SpeculationParams | None = None) -> Generator[Delta, None, Completion]:
        """Yield one request's deltas as the engine produces them; the last has its finish_reason (and
        the generator returns the `Completion`). The prompt is raw text, token ids, or a
        conversation (chat template applied). It is checked now and submitted on the first `next`;
        closing the generator early cancels the request."""
        prompt_ids = self._encode_all([prompt], chat=_is_conversation(prompt))
        [request] = self._requests(prompt_ids, sampling_params, speculation_params)
        return self._stream(request)

    # -- input ---------------------------------------------------------------------------------
    def _encode_all(self, prompts: list, chat: bool) -> list[list[int]]:
        if not prompts:
            raise RequestError("no prompts given")
        return [_numbered(i, len(prompts), self._encode, prompt, chat) for i, prompt in enumerate(prompts)]

    def _encode(self, prompt: Any, chat: bool) -> list[int]:
        if chat:
            if not _is_conversation(prompt):
                raise RequestError("a conversation must be a non-empty list of messages ({'role': ..., 'content': ...}), "
                                   f"got {type(prompt).__name__}")
            bad = next((j for j, m in enumerate(prompt) if not isinstance(m, Mapping) or "role" not in m), None)
            if bad is not None:
                raise RequestError(f"message {bad} must be a mapping with a 'role', got {prompt[bad]!r}")
            for j, message in enumerate(prompt):  # the tokenizer's own error on a lone surrogate names nothing
                if isinstance(message.get("content"), str):
                    check_unicode(message["content"], f"message {j}'s content")
            return encode_prompt(self.tokenizer, [dict(m) for m in prompt], chat=True)
        if isinstance(prompt, str):
            return encode_prompt(self.tokenizer, prompt, chat=False)
        if not _is_token_ids(prompt):
            raise RequestError(f"a prompt must be text or a list of token ids, got {type(prompt).__name__}")
        return [int(t) for t in prompt]  # checked against the vocabulary with the rest (`Engine.resolve`)

    def _requests(self, prompt_ids: list[list[int]], sampling_params: PerPrompt,
                  speculation_params: PerPrompt) -> list[ResolvedRequest]:
        """Each prompt with its sampling and speculation params, resolved by the engine's intake."""
        n = len(prompt_ids)
        samplings = _per_prompt(SamplingParams() if sampling_params is None else sampling_params,
                                SamplingParams, "sampling_params", n)
        speculations = _per_prompt(speculation_params, SpeculationParams, "speculation_params", n)
        return [_numbered(i, n, self.engine.resolve, ids, params, speculation)
                for i, (ids, params, speculation) in enumerate(zip(prompt_ids, samplings, speculations))]

    # -- decoding ------------------------------------------------------------------------------
    def _decode(self, requests: list[ResolvedRequest]) -> list[Completion]:
        ids = [self._submit(request) for request in requests]
        waiting = set(ids)
        try:
            while waiting and self.engine.has_work:
                waiting -= {d.request_id for d in self._step() if d.finish_reason is not None}
        except BaseException:  # KeyboardInterrupt, or a step that raised: free this call's requests
            for request_id in waiting:
                self._cancel(request_id)
            raise
        return [self.engine.collect(request_id) for request_id in ids]

    def _stream(self, request: ResolvedRequest) -> Generator[Delta, None, Completion]:
        request_id = self._submit(request)
        buffer = self._streamed[request_id] = deque()
        finished = False
        try:
            while not finished:
                while not buffer and self.engine.has_work:
                    self._step()
                if not buffer:  # ended without a last delta (cancelled through `engine`)
                    break
                delta = buffer.popleft()
                finished = delta.finish_reason is not None
                yield delta
        finally:  # also when the consumer closes the generator: the request is freed either way
            del self._streamed[request_id]
            output = self.engine.collect(request_id) if finished else self._cancel(request_id)
        return output

    def _submit(self, request: ResolvedRequest) -> str:
        request_id = self.engine.enqueue(request)
        self._live.add(request_id)
        return request_id

    def _step(self) -> list[Delta]:
        """One engine step; a stream's deltas are kept for it (another call's step may produce them)."""
        deltas = self.engine.step()
        for delta in deltas:
            if delta.request_id in self._streamed:
                self._streamed[delta.request_id].append(delta)
            if delta.finish_reason is not None:
                self._live.discard(delta.request_id)
        return deltas

    def _cancel(self, request_id: str) -> Completion:
        if request_id in self._live:
            self._live.discard(request_id)
            self.engine.cancel(request_id)
        return self.engine.collect(request_id)


def _is_list(value: Any) -> bool:
    return isinstance(value, Sequence) and not isinstance(value, str)


def _is_token_ids(value: Any) -> bool:
    return _is_list(value) and all(isinstance(t, Integral) and not isinstance(t, bool) for t in value)


def _is_conversation(value: Any) -> bool:
    """One conversation (a list of messages), as opposed to a list of them or a prompt."""
    return _is_list(value) and len(value) > 0 and isinstance(value[0], Mapping)


def _per_prompt(value: PerPrompt, kind: type, name: str, n: int) -> list:
    """One value per prompt: `value` for all, or a list of one per prompt."""
    if value is None or isinstance(value, kind):
        return [value] * n
    if isinstance(value, Sequence) and all(isinstance(v, kind) for v in value):
        if len(value) != n:
            raise RequestError(f"{name} has {len(value)} entries for {n} prompts")
        return list(value)
    raise RequestError(f"{name} must be a {kind.__name__} or a list of one per prompt, got {type(value).__name__}")


def _numbered(i: int, n: int, check, *args):
    """`check(*args)`, its RequestError naming the prompt where there are several."""
    try:
        return check(*args)
    except RequestError as exc:
        if n == 1:
            raise
        raise RequestError(f"prompt {i}: {exc}") from None

"""The OpenAI-compatible HTTP server: `POST /v1/completions`, `POST /v1/chat/completions` (streamed
as server-sent events or not), `GET /v1/models`, `GET /health` and `GET /metrics`.

This module parses, validates and formats; the engine runs on the `EngineService` thread. Every
client mistake is a 4xx with an OpenAI error body (`{"error": {"message", "type", "param", "code"}}`),
never a 500. A streamed request whose client goes away is cancelled and its rows freed. Before a
request is parsed, `specdraft.api.gate` checks its Host header, API key, content type and size.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import math
from contextlib import asynccontextmanager
from importlib.resources import files as resources_files
from typing import Sequence

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from sse_starlette.sse import EventSourceResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from specdraft.api import protocol
from specdraft.api.gate import Access, Gate
from specdraft.api.protocol import ChatRequest, CompletionRequest
from specdraft.engine import Completion, Delta
from specdraft.errors import RequestError
from specdraft.metrics import ServerMetrics
from specdraft.runtime import Runtime, encode_prompt
from specdraft.params import DEFAULT_MAX_QUEUED, DEFAULT_SAVE_EVERY
from specdraft.results import TokenLogprob
from specdraft.service import EngineService, Failed, Overloaded, ShuttingDown
from specdraft.text import characters_per_token

log = logging.getLogger("specdraft.server")
POLL_DISCONNECT = 0.5  # seconds between checks that a non-streamed request's client is still there
_TYPE_NAMES = {"str", "int", "float", "bool", "list", "dict", "none"}


class ApiError(Exception):
    def __init__(self, status: int, message: str, type_: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.body = status, protocol.error_body(message, type_, param, code)


def served_name(runtime: Runtime) -> str:
    """The model id clients send: the loaded model's name without notes in parentheses."""
    return runtime.target.name.split(" (")[0]


def create_app(runtime: Runtime, max_queued: int = DEFAULT_MAX_QUEUED, save_every: float = DEFAULT_SAVE_EVERY,
               model_name: str | None = None, access: Access | None = None) -> FastAPI:
    """The app over a built runtime. What its drafters keep across requests (the n-gram memory, where
    it has a path) is saved every `save_every` seconds and at shutdown. access: who may call it and
    what it reads (default `Access()`: no key, localhost names and IP addresses, 4 MiB bodies)."""
    api = Api(runtime, max_queued, save_every, model_name)
    app = FastAPI(title="specdraft", version="0.1.0", lifespan=api.lifespan,
                  description="Lossless speculative decoding behind an OpenAI-compatible API.")
    app.add_middleware(Gate, access=access or Access())
    app.state.service, app.state.runtime, app.state.metrics = api.service, runtime, api.metrics
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(RequestValidationError, api.invalid)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _internal_error)
    app.get("/", response_class=HTMLResponse, include_in_schema=False)(api.playground)
    app.get("/health")(api.health)
    app.get("/metrics")(api.prometheus)
    app.get("/v1/models")(api.models)
    app.post("/v1/completions")(api.completions)
    app.post("/v1/chat/completions")(api.chat)
    return app


# -- errors: always OpenAI's body ------------------------------------------------------------
async def _api_error(_request: Request, exc: ApiError):
    return JSONResponse(exc.body, status_code=exc.status)


async def _http_error(_request: Request, exc: StarletteHTTPException):
    kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
    return JSONResponse(protocol.error_body(str(exc.detail), kind), exc.status_code)


async def _internal_error(_request: Request, exc: Exception):
    log.exception("unhandled error")
    return JSONResponse(protocol.error_body(f"internal error: {type(exc).__name__}", "internal_error"), 500)


def _validation_error(exc: RequestValidationError) -> JSONResponse:
    """A body that does not parse or validate: the first problem, naming its field."""
    first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request", "type": ""}
    cause = first.get("ctx", {}).get("error")
    if isinstance(cause, RequestError):  # a check of ours that names its field (`check_unicode`)
        return JSONResponse(protocol.error_body(str(cause), param=cause.param, code=cause.code), 400)
    if first.get("type") == "json_invalid":
        return JSONResponse(protocol.error_body(f"the body is not valid JSON: {first.get('ctx', {}).get('error', first['msg'])}"), 400)
    loc, union = [], False
    for part in first.get("loc", ()):
        if part == "body":
            continue
        if isinstance(part, str) and (not part.isidentifier() or part in _TYPE_NAMES):
            union = True  # pydantic names the member of a union it tried: not a field
            break
        loc.append(str(part))
    param = ".".join(loc) or None
    message = first["msg"].removeprefix("Value error, ")
    if union:
        message = f"has the wrong type ({message[0].lower() + message[1:]}, or one of the other accepted types)"
    if first.get("type") == "extra_forbidden":
        message = "unknown field (not part of this API)"
    if first.get("type") == "missing":
        message = "is required"
    return JSONResponse(protocol.error_body(f"{param}: {message}" if param else message, param=param), 400)


class Api:
    """The routes over one runtime, whose engine runs on an `EngineService` thread."""

    def __init__(self, runtime: Runtime, max_queued: int, save_every: float, model_name: str | None) -> None:
        self.runtime, self.engine = runtime, runtime.engine
        self.name = model_name or served_name(runtime)
        self.metrics = ServerMetrics()
        resources = runtime.resources
        self.service = EngineService(self.engine, max_queued, on_step=self.metrics.on_step,
                                     on_finish=self.metrics.on_finish,
                                     periodic=resources.save if resources.saves else None, every_seconds=save_every)
        per_token = characters_per_token(runtime.target.tokenizer)
        # The most characters a prompt's text may have and still leave room in the context (None: no sound bound).
        self.most_characters = None if per_token is None else self.engine.max_context * per_token
        self._page = resources_files("specdraft.api").joinpath("playground.html").read_text(encoding="utf-8")
        # A token's text for logprobs, decoded once per token id.
        self._token_text = functools.lru_cache(maxsize=1 << 16)(functools.partial(_token_text, runtime.target.tokenizer))

    @asynccontextmanager
    async def lifespan(self, _app: FastAPI):
        self.service.start()
        yield
        await run_in_threadpool(self.service.shutdown)

    async def invalid(self, _request: Request, exc: RequestValidationError):
        self.metrics.refused("invalid")
        return _validation_error(exc)

    # -- routes ----------------------------------------------------------------------------------
    async def playground(self):
        """The playground: a page that streams requests through this API and shades accepted draft tokens."""
        return HTMLResponse(self._page)

    async def health(self):
        if self.service.stopping:
            raise ApiError(503, "the server is shutting down", "service_unavailable")
        stats = self.service.stats  # the engine thread's snapshot: never its live tables
        return {"status": "ok", "model": self.name, "running": stats.running, "waiting": stats.waiting}

    async def prometheus(self):
        return Response(self.metrics.render(self.service.stats), media_type="text/plain; version=0.0.4; charset=utf-8")

    async def models(self):
        return {"object": "list", "data": [{"id": self.name, "object": "model", "created": protocol.created(),
                                             "owned_by": "specdraft", "max_model_len": self.engine.max_context,
                                             "drafters": sorted(self.engine.drafters)}]}

    async def completions(self, body: CompletionRequest, request: Request):
        prompt = body.prompt
        if isinstance(prompt, list) and (not prompt or isinstance(prompt[0], int)):  # token ids: `_serve` checks them
            prompt_ids = list(prompt)
        else:
            text = prompt[0] if isinstance(prompt, list) else prompt
            self._check_characters(text)
            prompt_ids = await run_in_threadpool(_encode, self.runtime, text, False)
        return await self._serve("completion", body, body.max_tokens, prompt_ids, request)

    def _check_characters(self, text: str) -> None:
        """Refuse raw text too long for the context by its characters, before tokenizing it. Chat has no
        such check: its template may drop text (a reasoning model's earlier thinking, trimmed spaces), so
        its messages' characters bound nothing; the body's size bounds what is tokenized."""
        if self.most_characters is None or len(text) <= self.most_characters:
            return
        per_token = self.most_characters // self.engine.max_context
        raise ApiError(400, f"the prompt has {len(text)} characters, so at least {math.ceil(len(text) / per_token)} "
                            f"tokens (this model's tokens are at most {per_token} characters); this model's context is "
                            f"{self.engine.max_context} tokens, leaving no room to generate", param="prompt",
                       code="context_length_exceeded")

    async def chat(self, body: ChatRequest, request: Request):
        if body.max_tokens is not None and body.max_completion_tokens is not None and body.max_tokens != body.max_completion_tokens:
            raise ApiError(400, "max_tokens and max_completion_tokens disagree; give one", param="max_completion_tokens")
        prompt_ids = await run_in_threadpool(_encode, self.runtime, body.chat(), True)
        return await self._serve("chat", body, body.max_completion_tokens or body.max_tokens, prompt_ids, request)

    # -- serving a request -----------------------------------------------------------------------
    async def _serve(self, kind: str, body, max_tokens: int | None, prompt_ids: list[int], request: Request):
        if body.model is not None and body.model != self.name:
            raise ApiError(404, f"the model {body.model!r} does not exist here; this server serves {self.name!r}",
                           "not_found_error", "model", "model_not_found")
        try:  # the engine's intake: the one check (the room rule included: max_tokens None is what fits)
            resolved = await run_in_threadpool(self.engine.resolve, prompt_ids, body.sampling_params(max_tokens),
                                               body.speculation_params(), "messages" if kind == "chat" else "prompt")
        except (RequestError, ValueError) as exc:
            known = isinstance(exc, RequestError)
            raise ApiError(400, str(exc), param=exc.param if known else None, code=exc.code if known else None) from None
        request_id = resolved.id
        try:
            queue = self.service.submit(resolved)
        except Overloaded as exc:
            self.metrics.refused("overloaded")
            raise ApiError(429, str(exc), "rate_limit_error", code="rate_limit_exceeded") from None
        except ShuttingDown as exc:
            self.metrics.refused("shutting_down")
            raise ApiError(503, str(exc), "service_unavailable") from None
        response_id = protocol.new_id("chatcmpl" if kind == "chat" else "cmpl")
        if body.stream:
            return EventSourceResponse(self._stream(kind, body, response_id, request_id, queue, len(prompt_ids)), ping=15,
                                       sep="\n")
        return await self._whole(kind, response_id, request_id, queue, len(prompt_ids), request)

    async def _whole(self, kind: str, response_id: str, request_id: str, queue: asyncio.Queue, prompt_tokens: int,
                     request: Request):
        while True:  # the deltas are a stream's; the reply is the completion's own text
            try:
                event = await asyncio.wait_for(queue.get(), POLL_DISCONNECT)
            except TimeoutError:
                if await request.is_disconnected():
                    self.service.cancel(request_id)
                    return Response(status_code=499)
                continue
            if isinstance(event, Delta):
                continue
            if isinstance(event, Failed) or event.finish_reason == "error":
                message = event.message if isinstance(event, Failed) else event.error
                raise ApiError(500, f"generation failed: {message}", "internal_error")
            break
        completion: Completion = event
        choice = ({"index": 0, "message": {"role": "assistant", "content": completion.text}} if kind == "chat"
                  else {"index": 0, "text": completion.text})
        choice.update(logprobs=self._logprobs(kind, completion.logprobs), finish_reason=completion.finish_reason)
        structured = protocol.structured_output(completion.metrics, completion.finish_reason)
        if structured is not None:
            choice["structured_output"] = structured
        return {"id": response_id, "object": "chat.completion" if kind == "chat" else "text_completion",
                "created": protocol.created(), "model": self.name, "choices": [choice],
                "usage": protocol.usage(prompt_tokens, len(completion.token_ids), completion.metrics)}

    async def _stream(self, kind: str, body, response_id: str, request_id: str, queue: asyncio.Queue, prompt_tokens: int):
        base = {"id": response_id, "object": "chat.completion.chunk" if kind == "chat" else "text_completion",
                "created": protocol.created(), "model": self.name}
        finished, offset = False, 0  # offset: the length of the token texts streamed so far
        try:
            if kind == "chat":
                yield _chunk(kind, base, None, role=True)
            while True:
                event = await queue.get()
                if isinstance(event, Delta):
                    if event.text or event.logprobs:  # a chunk carries its tokens' logprobs, with or without text
                        logprobs = self._logprobs(kind, event.logprobs, offset)
                        offset += sum(len(self._token_text(e.token)) for e in event.logprobs or ())
                        yield _chunk(kind, base, event.text, drafted=event.drafted_text if body.annotate else None,
                                     logprobs=logprobs)
                    continue
                finished = True
                if isinstance(event, Failed) or event.finish_reason == "error":
                    message = event.message if isinstance(event, Failed) else event.error
                    yield {"data": json.dumps(protocol.error_body(f"generation failed: {message}", "internal_error"))}
                    break
                yield _chunk(kind, base, None, finish_reason=event.finish_reason,
                             structured=protocol.structured_output(event.metrics, event.finish_reason))
                if body.include_usage:
                    usage = protocol.usage(prompt_tokens, len(event.token_ids), event.metrics)
                    yield {"data": json.dumps({**base, "choices": [], "usage": usage})}
                break
            yield {"data": "[DONE]"}
        finally:
            if not finished:  # the client went away mid-stream
                self.service.cancel(request_id)

    def _logprobs(self, kind: str, entries: Sequence[TokenLogprob] | None, offset: int = 0) -> dict | None:
        """A choice's `logprobs` in its endpoint's format (None where the request asked for none);
        offset: the length of the token texts earlier chunks of a stream carried (completions)."""
        if entries is None:
            return None
        if kind == "chat":
            return protocol.chat_logprobs(entries, self._token_text)
        return protocol.completion_logprobs(entries, self._token_text, offset)

def _chunk(kind: str, base: dict, text: str | None, finish_reason: str | None = None, role: bool = False,
           drafted: str | None = None, structured: dict | None = None, logprobs: dict | None = None) -> dict:
    """One server-sent event of a streamed response."""
    if kind == "chat":
        delta = {} if text is None else {"content": text}
        if role:
            delta = {"role": "assistant", "content": ""}
        choice = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
    else:
        choice = {"index": 0, "text": text or "", "logprobs": logprobs, "finish_reason": finish_reason}
    if drafted is not None:
        choice["speculation"] = {"drafted_text": drafted}
    if structured is not None:
        choice["structured_output"] = structured
    return {"data": json.dumps({**base, "choices": [choice]}, ensure_ascii=False)}


def _token_text(tokenizer, token: int) -> str:
    """One token's text as logprobs show it (special tokens included; a token that is part of a
    character reads as U+FFFD)."""
    return tokenizer.decode([token], skip_special_tokens=False, clean_up_tokenization_spaces=False)


def _encode(runtime: Runtime, prompt, chat: bool) -> list[int]:
    try:
        return encode_prompt(runtime.target.tokenizer, prompt, chat=chat)
    except RequestError as exc:
        raise ApiError(400, str(exc), param="messages" if chat else "prompt") from None

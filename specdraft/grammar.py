"""Structured output: a request's `ResponseFormat` compiled into a grammar over the target's tokens,
and per request a `RowGrammar` that the verifier masks the target's logits with and the engine cuts
drafts with. The grammar library is llguidance (a Rust core without Python dependencies; its masks
cost microseconds here, see `benchmarks/results/serving/structured.md`).

Terms:
- **legal** token: one the grammar allows after the tokens before it; **mask**: the legal tokens at
  one position, one bit per token id.
- **forced** tokens: the canonical tokenization of the bytes every legal continuation starts with
  (`{"name": "` after nothing, for a schema whose first key is `name`). They are drafted for free;
  the target, masked, still decides each one, so they are verified like any draft token.

JSON is compiled without free whitespace (`", "` between items, `": "` after keys), the way
`json.dumps` writes it: the output stays bounded (a small model cannot loop on blank lines) and the
grammar forces every key, quote and separator.

Threads: the engine's thread steps the `RowGrammar`s; `GrammarCompiler.matcher` runs where a request
enters (a server's request threads too), so the compiler's cache is guarded by a lock (compiling runs
outside it).
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Sequence
from urllib.parse import unquote

import torch

from specdraft.params import ResponseFormat

if TYPE_CHECKING:
    import llguidance

JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
CACHED_GRAMMARS = 256  # compiled response formats kept: more than a server holds requests (rows + queue)
_BITS = torch.tensor([[(byte >> i) & 1 for i in range(8)] for byte in range(256)], dtype=torch.bool)  # [256, 8]


class GrammarError(ValueError):
    """A response format that cannot be compiled, or a grammar that failed while decoding; the message
    names the problem."""


def mask_words(vocab_size: int) -> int:
    """int32 words in one mask of `vocab_size` bits."""
    return (vocab_size + 31) // 32


def unpack(bits: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Masks as booleans: bits int32 [..., words] -> allowed bool [..., vocab_size] (bit i of word w is
    token 32 w + i; read as bytes on a little-endian host, bit i of byte j is token 8 j + i)."""
    table = _BITS.to(bits.device)
    return table[bits.contiguous().view(torch.uint8).long()].flatten(-2)[..., :vocab_size]


class RowGrammar:
    """One request's grammar state: the tokens it has emitted so far (`advance`). Every other method
    looks ahead from that state without changing it.

    An end-of-sequence token (`eos`) is legal only where the JSON is complete, and ends the output:
    the grammar is not advanced over it (a finished matcher takes it without counting it)."""

    def __init__(self, matcher: llguidance.LLMatcher, eos: frozenset[int]) -> None:
        self._matcher, self.eos = matcher, eos
        self.emitted = 0  # tokens advanced over, up to an end-of-sequence token
        self.ended = False  # an end-of-sequence token was emitted

    def legal_prefix(self, tokens: Sequence[int]) -> int:
        """How many leading `tokens` the grammar allows, in order, after what was emitted (up to and
        including an end-of-sequence token where the JSON is complete; nothing after it). Token ids
        must be in the vocabulary."""
        if not len(tokens) or self.ended:
            return 0
        tokens = [int(t) for t in tokens]
        legal = self._matcher.validate_tokens(tokens)
        if self._matcher.is_error():
            raise GrammarError(f"the grammar failed: {self._matcher.get_error()}")
        if legal < len(tokens) and tokens[legal] in self.eos and self._accepting_after(tokens[:legal]):
            legal += 1
        return legal

    def forced(self, after: Sequence[int], limit: int) -> list[int]:
        """Up to `limit` forced tokens after the (legal) tokens `after`."""
        after = [int(t) for t in after]
        if limit <= 0 or self.ended or (after and after[-1] in self.eos):
            return []
        matcher = self._matcher
        self._consume(after)
        try:
            return [] if matcher.is_stopped() else matcher.compute_ff_tokens()[:limit]
        finally:
            matcher.rollback(len(after))

    def masks(self, draft: Sequence[int], out: torch.Tensor) -> None:
        """The masks at the positions a verify step decides: out int32 [>= len(draft) + 1, words], row i
        the mask after draft tokens 1..i (the draft must be legal). Where the JSON is complete only
        the end-of-sequence tokens are legal; after one, every token (nothing there is emitted)."""
        matcher = self._matcher
        if matcher.is_error():
            raise GrammarError(f"the grammar failed: {matcher.get_error()}")
        assert out.dtype == torch.int32 and out.is_contiguous() and out.device.type == "cpu"
        width, consumed = out.shape[1] * 4, 0
        try:
            for i in range(len(draft) + 1):
                if self.ended or (i and int(draft[i - 1]) in self.eos):
                    out[i:].fill_(-1)
                    break
                if i:
                    self._consume([int(draft[i - 1])])
                    consumed += 1
                matcher.unsafe_compute_mask_ptr(out[i].data_ptr(), width)
        finally:
            matcher.rollback(consumed)

    def advance(self, tokens: Sequence[int]) -> None:
        """The tokens the request emitted (each was legal: the target's logits were masked)."""
        if self.ended or not len(tokens):
            return
        tokens = [int(t) for t in tokens]
        end = next((i for i, t in enumerate(tokens) if t in self.eos), None)
        if end is not None:
            tokens, self.ended = tokens[:end], True
        if tokens and not self._matcher.consume_tokens(tokens):
            raise GrammarError(f"the grammar refused an emitted token: {self._matcher.get_error()}")
        self.emitted += len(tokens)

    def complete(self, kept: int) -> bool:
        """Whether the first `kept` emitted tokens (a request keeps fewer than the verifier emitted
        where it stops mid-step) are a whole output of the grammar: a finished JSON value. For a
        request that has ended (it rolls the grammar back to there)."""
        if kept < self.emitted:
            self._matcher.rollback(self.emitted - kept)
            self.emitted, self.ended = kept, False
        return self._matcher.is_accepting()

    def _accepting_after(self, tokens: list[int]) -> bool:
        self._consume(tokens)
        try:
            return self._matcher.is_accepting()
        finally:
            self._matcher.rollback(len(tokens))

    def _consume(self, tokens: list[int]) -> None:
        """Look ahead over tokens known to be legal; a grammar that fails there (a resource limit) fails its request."""
        if tokens and not self._matcher.consume_tokens(tokens):
            raise GrammarError(f"the grammar failed: {self._matcher.get_error() or 'a legal token was refused'}")


def _ref_cycle(schema: Any) -> list[str] | None:
    """A chain of local `$ref`s and `allOf`s that comes back to where it started (`{"$ref": "#"}`): a
    schema that is only itself, which validators recurse on forever and a grammar cannot start. The
    chain's JSON pointers, its first repeated last; None where there is none. A reference under a
    property or an item (a tree of nodes) has JSON around it and is no such cycle."""
    edges: dict[str, list[str]] = {}

    def walk(node: Any, pointer: str) -> None:
        if isinstance(node, dict):
            ref = node.get("$ref")
            local = isinstance(ref, str) and (ref == "#" or ref.startswith("#/"))
            parts = node.get("allOf") if isinstance(node.get("allOf"), list) else []
            edges[pointer] = ([unquote(ref[1:])] if local else []) + [f"{pointer}/allOf/{i}" for i in range(len(parts))]
            for key, value in node.items():
                walk(value, f"{pointer}/{str(key).replace('~', '~0').replace('/', '~1')}")
        elif isinstance(node, list):
            for i, value in enumerate(node):
                walk(value, f"{pointer}/{i}")

    walk(schema, "")
    done: set[str] = set()

    def visit(pointer: str, path: list[str]) -> list[str] | None:
        if pointer in path:
            return [f"#{p}" for p in path[path.index(pointer):]] + [f"#{pointer}"]
        if pointer in done:
            return None
        found = next(filter(None, (visit(target, [*path, pointer]) for target in edges.get(pointer, ()))), None)
        done.add(pointer)
        return found

    return next(filter(None, (visit(pointer, []) for pointer in list(edges))), None)


def _starts(matcher: llguidance.LLMatcher) -> bool:
    """Whether some token can begin an output (a grammar that describes no value has none)."""
    probe = matcher.deep_copy()
    probe.compute_bitmask()
    return not probe.is_error() and not probe.is_stopped()


class GrammarCompiler:
    """Compiles response formats for one tokenizer. tokenizer: a Hugging Face fast tokenizer, or an
    object with llguidance's `TokenizerWrapper` fields (`tokens` as bytes, `eos_token_id`,
    `bos_token_id`, and a call that encodes text); vocab_size: the width of the target's logits;
    eos_token_ids: the tokens that end a request (the grammar allows them where the JSON is complete).
    The tokenizer is converted on first use (about a second), not at start."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_ids: Sequence[int]) -> None:
        self._tokenizer, self.vocab_size, self.eos_token_ids = tokenizer, vocab_size, list(eos_token_ids)
        self._lltokenizer: llguidance.LLTokenizer | None = None
        self._compiled: OrderedDict[ResponseFormat, llguidance.LLMatcher] = OrderedDict()
        self._lock = threading.Lock()  # the cache
        self._convert_lock = threading.Lock()  # the tokenizer's conversion

    def matcher(self, response_format: ResponseFormat) -> RowGrammar:
        """A fresh grammar state for one request. Compiling runs outside the lock, so that one
        request's new schema does not hold up another's cached one (two threads may both compile a
        new schema; the first to finish is kept)."""
        with self._lock:
            pristine = self._compiled.get(response_format)
            if pristine is not None:
                self._compiled.move_to_end(response_format)
                return RowGrammar(pristine.deep_copy(), self._eos)
        compiled = self._compile(response_format)
        with self._lock:
            pristine = self._compiled.setdefault(response_format, compiled)
            if len(self._compiled) > CACHED_GRAMMARS:
                self._compiled.popitem(last=False)
            return RowGrammar(pristine.deep_copy(), self._eos)

    def _compile(self, response_format: ResponseFormat) -> llguidance.LLMatcher:
        import llguidance

        schema: Any = {"type": "object"} if response_format.type == "json_object" else json.loads(response_format.schema)
        if schema is False:
            raise GrammarError("response_format: the JSON schema is false, which no value satisfies")
        if schema is True:
            schema = {}  # any JSON value
        cycle = _ref_cycle(schema)
        if cycle:
            raise GrammarError(f"response_format: the JSON schema refers to itself with nothing in between "
                               f"({' -> '.join(cycle)}), so it describes no value")
        tokenizer = self._llguidance_tokenizer()
        try:
            grammar = llguidance.LLMatcher.grammar_from_json_schema(schema, overrides=JSON_OPTIONS)
            problem = llguidance.LLMatcher.validate_grammar(grammar, tokenizer)
            matcher = None if problem else llguidance.LLMatcher(tokenizer, grammar, log_level=0)
        except Exception as exc:  # noqa: BLE001 - whatever the library raises on a schema is the schema's problem
            problem = f"{type(exc).__name__}: {exc}"
        if not problem and matcher.is_error():
            problem = matcher.get_error()
        if not problem and not _starts(matcher):
            problem = "no JSON value satisfies it"
        if problem:
            raise GrammarError(f"response_format: the JSON schema cannot be used: {' '.join(problem.split())}")
        return matcher

    def _llguidance_tokenizer(self) -> llguidance.LLTokenizer:
        with self._convert_lock:  # converted once, by the first thread that needs it
            return self._convert_tokenizer()

    def _convert_tokenizer(self) -> llguidance.LLTokenizer:
        if self._lltokenizer is None:
            import llguidance
            import llguidance.hf
            from transformers import PreTrainedTokenizerFast

            eos = self.eos_token_ids or None
            try:
                if isinstance(self._tokenizer, PreTrainedTokenizerFast):
                    self._lltokenizer = llguidance.hf.from_tokenizer(self._tokenizer, n_vocab=self.vocab_size, eos_token=eos)
                else:
                    self._lltokenizer = llguidance.LLTokenizer(llguidance.TokenizerWrapper(self._tokenizer),
                                                               n_vocab=self.vocab_size, eos_token=eos)
            except Exception as exc:  # noqa: BLE001 - a tokenizer the grammar library cannot read
                raise GrammarError(f"response_format is not available with this model's tokenizer "
                                   f"({type(self._tokenizer).__name__}): {type(exc).__name__}: {exc}") from None
        return self._lltokenizer

    @property
    def _eos(self) -> frozenset[int]:
        return frozenset(self.eos_token_ids or self._llguidance_tokenizer().eos_tokens)

"""`specdraft` command line: `generate` (one prompt), `serve` (the OpenAI-compatible server),
`drafters` (every drafter, built-in or plugin, with its options) and `models` (the models known by name).

Options are parsed here, the engine's into one `Settings` (which checks them); bad input exits non-zero
with one line naming it."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
from pathlib import Path

from specdraft.drafters import DEFAULT_DRAFTER, check_options, drafter_names, uses
from specdraft.params import (DEFAULT_MAX_QUEUED, DEFAULT_SAVE_EVERY, ARITHMETIC, MAX_TEMPERATURE, POLICIES, WEIGHTS,
                              SamplingParams)
from specdraft.settings import DTYPES, ONE_REQUEST, Settings, default, server_drafters


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, no usage dump
        sys.stderr.write(f"specdraft: error: {message}\n")
        sys.exit(2)


def _integer(name: str, low: int, high: int | None = None):
    """An argparse type: an integer in [low, high] (no upper bound if high is None)."""

    def parse(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be an integer, got {value!r}") from None
        if high is not None and not low <= number <= high:
            raise argparse.ArgumentTypeError(f"{name} must be between {low} and {high}, got {number}")
        if number < low:
            raise argparse.ArgumentTypeError(f"{name} must be >= {low}, got {number}")
        return number

    return parse


def _positive(name: str):
    return _integer(name, 1)


def _number(name: str, low: float, high: float):
    """An argparse type: a number in [low, high]."""

    def parse(value: str) -> float:
        try:
            number = float(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be a number, got {value!r}") from None
        if not low <= number <= high:
            raise argparse.ArgumentTypeError(f"{name} must be between {low:g} and {high:g}, got {value}")
        return number

    return parse


def _draft_length(value: str) -> int:
    from specdraft.params import check_num_speculative_tokens

    try:
        return check_num_speculative_tokens(int(value), "--num-speculative-tokens")
    except ValueError as exc:
        message = str(exc) if value.strip().lstrip("-").isdigit() else f"--num-speculative-tokens must be an integer, got {value!r}"
        raise argparse.ArgumentTypeError(message) from None


def _drafter_options(value: str) -> dict[str, dict]:
    """--drafter-options: a JSON object of objects, `{"ngram": {"max_n": 4}, ...}`; every drafter
    named must exist and take every option given it."""
    try:
        options = json.loads(value)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"must be a JSON object, got {value!r} ({exc})") from None
    if not isinstance(options, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object of drafter names to options, got {value!r}")
    for name, given in options.items():
        if not isinstance(given, dict):
            raise argparse.ArgumentTypeError(f"the options of {name!r} must be a JSON object, got {json.dumps(given)}")
        if name not in drafter_names():
            raise argparse.ArgumentTypeError(f"unknown drafter {name!r}; choose from {', '.join(drafter_names())}")
        try:
            check_options(name, given)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return options


class _KindNames:
    """The block kinds the native kernel reads, from its table (`native.KINDS`), named when a help text
    is shown (as `%(kinds)s`): the table loads torch, which the CLI's other paths load only for a model."""

    def __str__(self) -> str:
        from specdraft.backend.native import KINDS
        return ", ".join(kind.name for kind in KINDS.values())


def add_model_options(parser: argparse.ArgumentParser) -> None:
    """The options of the model and its engine, shared by generate and serve. An option that sets a
    `Settings` field is stored under the field's name (`settings_from` reads them); one left out is not
    set (SUPPRESS, or None where the field's default is None), so that `Settings` owns every default."""
    parser.add_argument("--model", default=None,
                        help="a name `specdraft models` lists (fetched on first use), a local directory or .gguf file, "
                             "or a Hugging Face id owner/name (default: embedded SmolLM2-135M-Instruct)")
    parser.add_argument("--drafter", default=None, choices=drafter_names(),
                        help="how drafts are proposed: a built-in drafter or an installed plugin (`specdraft drafters` "
                             f"lists them; none = plain decoding). Default: the first of serve's --drafters, else {DEFAULT_DRAFTER}")
    parser.add_argument("--drafter-options", type=_drafter_options, default=None, metavar="JSON",
                        help='options by drafter, e.g. \'{"ngram": {"max_n": 4}}\' (`specdraft drafters` lists them)')
    parser.add_argument("--policy", default=argparse.SUPPRESS, choices=POLICIES,
                        help="how each step's draft length is chosen: auto = the cost-aware policy (drafts only where "
                             "it pays); fixed = as long as the drafter goes, up to k, every step (measures a drafter as it "
                             f"is). Default: {default('policy')}")
    parser.add_argument("--draft-model", default=None,
                        help="draft model for the model and hybrid drafters: HF id, directory or .gguf sharing the "
                             "target's vocabulary (default: self-int8, an int8 copy of the target)")
    parser.add_argument("-k", "--num-speculative-tokens", dest="k", type=_draft_length, default=argparse.SUPPRESS,
                        metavar="NUM_SPECULATIVE_TOKENS",
                        help=f"longest draft per step (0..64; 0 = plain decoding). Default: {default('k')}")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda when present)")
    parser.add_argument("--dtype", default=argparse.SUPPRESS, choices=DTYPES,
                        help="auto: float32 on CPU, bfloat16 on CUDA; float32 gives exact parity with plain decoding on a GPU")
    weights = parser.add_argument("--weights", default=argparse.SUPPRESS, choices=WEIGHTS,
                                  help="a GGUF model's quantised layers (%(kinds)s) read as the file's blocks (native: a "
                                       "fifth of the bytes a token; auto takes it on CPU) or as a float32 copy (dense); same output")
    weights.kinds = _KindNames()
    parser.add_argument("--arithmetic", default=argparse.SUPPRESS, choices=ARITHMETIC,
                        help="what native weights compute in: int8 (activations quantised in blocks of 32, integer "
                             "dot products: fastest), float32 (the dense model's arithmetic, bitwise); auto: int8 "
                             "where native weights load. Speculation is lossless in either")
    parser.add_argument("--enforce-eager", action="store_true", default=argparse.SUPPRESS,
                        help="run steps eagerly: no CUDA graphs on CUDA, no compiled step on CPU")
    parser.add_argument("--recalibrate", action="store_true", default=argparse.SUPPRESS,
                        help="measure this machine's costs at start even where a calibration is kept for the same "
                             "machine, models and settings (it is kept again)")
    parser.add_argument("--verify", action="store_true",
                        help="hash a model `specdraft models` lists (the target's and the draft's) against the "
                             "catalogue before loading it, even where it has not changed since it was verified")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="specdraft", description="Lossless speculative decoding with pluggable drafters.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    gen = sub.add_parser("generate", help="generate a completion for one prompt")
    gen.add_argument("prompt", help="the prompt text ('-' reads stdin)")
    add_model_options(gen)
    gen.add_argument("--max-tokens", type=_positive("--max-tokens"), default=SamplingParams.max_tokens,
                     help="the most tokens to generate (default: what fits in the context with the prompt, as "
                          "SamplingParams; more than fits is an error naming the numbers)")
    gen.add_argument("--temperature", type=_number("--temperature", 0.0, MAX_TEMPERATURE), default=0.0,
                     help=f"0 = greedy (at most {MAX_TEMPERATURE:g}, as the server takes)")
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--top-k", type=int, default=0)
    gen.add_argument("--seed", type=int, default=None)
    gen.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    gen.add_argument("--no-chat", action="store_true", help="raw completion instead of the chat template")
    gen.add_argument("--json", action="store_true", help="print one JSON object with text, token ids and metrics")
    structured = gen.add_mutually_exclusive_group()
    structured.add_argument("--json-schema", type=_json_schema, default=None, metavar="FILE",
                            help="constrain the output to JSON valid under the JSON Schema in FILE")
    structured.add_argument("--json-object", action="store_true", help="constrain the output to a JSON object")
    gen.set_defaults(**ONE_REQUEST)

    serve = sub.add_parser("serve", help="serve an OpenAI-compatible completions API (SSE streaming)")
    add_model_options(serve)
    serve.add_argument("--drafters", type=_drafter_list, default=None,
                       help=f"comma-separated drafters requests may choose (default: {','.join(server_drafters())})")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=_port, default=8000)
    serve.add_argument("--max-batch-size", dest="max_batch", type=_positive("--max-batch-size"), default=argparse.SUPPRESS,
                       metavar="MAX_BATCH_SIZE", help=f"rows decoded together (default: {default('max_batch')})")
    serve.add_argument("--max-queue", type=_integer("--max-queue", 0), default=DEFAULT_MAX_QUEUED,
                       help="requests that may wait for a row; beyond them a request gets 429")
    serve.add_argument("--max-model-len", dest="max_context", type=_positive("--max-model-len"), default=None, metavar="MAX_MODEL_LEN",
                       help="context length to serve (default: the model's)")
    serve.add_argument("--served-model-name", default=None, help="the model id clients send (default: the model's name)")
    serve.add_argument("--prefix-cache-mb", type=_integer("--prefix-cache-mb", 0), default=argparse.SUPPRESS,
                       metavar="MB", help="keep earlier requests' keys and values, up to this many MiB, for prompts that "
                            f"start alike (multi-turn chats, shared system prompts); 0 turns it off (default: {default('prefix_cache_mb')})")
    serve.add_argument("--ngram-memory", nargs="?", const="", type=_ngram_memory, default=None, metavar="PATH",
                       help="let the ngram drafter (and hybrid's n-gram part) draft from earlier requests' outputs; with "
                            "PATH, load it from there at start and save it there periodically and at shutdown")
    serve.add_argument("--ngram-memory-save-every", type=_positive("--ngram-memory-save-every"), default=DEFAULT_SAVE_EVERY,
                       metavar="SECONDS")
    # Who may call the server and what it reads (`specdraft.api.gate.access_for` owns the defaults).
    serve.add_argument("--api-key", default=None, metavar="KEY",
                       help="the key clients must send (Authorization: Bearer KEY) on every route but /health "
                            "(default: $SPECDRAFT_API_KEY; neither: no key)")
    serve.add_argument("--allowed-hosts", type=lambda value: [h.strip() for h in value.split(",") if h.strip()],
                       default=[], metavar="HOSTS",
                       help="comma-separated host names the Host header may carry besides localhost, the --host and IP "
                            "addresses (against DNS rebinding); * allows any")
    serve.add_argument("--max-body-bytes", type=_positive("--max-body-bytes"), default=None, metavar="BYTES",
                       help="the largest request body read; a larger one gets 413 (default: 4 MiB)")

    sub.add_parser("drafters", help="list every drafter (built-in and installed plugins), where it comes from and its options")
    add_models_command(sub)
    return parser


def add_models_command(sub) -> None:
    models = sub.add_parser("models", help="list the models known by name (--model NAME), their sizes and what is cached")
    models.add_argument("--fetch", nargs="+", default=[], metavar="NAME",
                        help="fetch and verify these models now (otherwise their first use does)")
    models.add_argument("--force", action="store_true",
                        help="with --fetch: fetch again whatever is cached (a file that changed since it was verified)")
    models.add_argument("--verify", action="store_true",
                        help="hash every model that is here (fetched or installed) against the catalogue first")
    models.add_argument("--json", action="store_true", help="print a JSON array, one object a model")
    models.add_argument("files", nargs="*", type=Path, metavar="FILE.gguf",
                        help="instead of the list: say for each local GGUF whether it loads here, which of its "
                             "weights run natively (read as its own blocks) and, for the rest, why not")


def _drafter_list(value: str) -> list[str]:
    names = [n.strip() for n in value.split(",") if n.strip()]
    unknown = [n for n in names if n not in drafter_names()]
    if not names or unknown:
        raise argparse.ArgumentTypeError(f"unknown drafter {unknown[0]!r}; choose from {', '.join(drafter_names())}"
                                         if unknown else "give at least one drafter")
    return names


def _json_schema(path: str):
    """--json-schema FILE: a JSON Schema, read and parsed here (whether it compiles is the engine's
    check, against the model's tokenizer)."""
    from specdraft.params import ResponseFormat

    try:
        with open(path, encoding="utf-8") as file:
            text = file.read()
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"cannot read {path}: {exc.strerror}") from None
    try:
        return ResponseFormat.json_schema(json.loads(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{path} is not a JSON Schema: {exc}") from None


def _port(value: str) -> int:
    return _integer("--port", 0, 65535)(value)


def _ngram_memory(value: str) -> str:
    """--ngram-memory PATH: a memory saved before, or a new file in a folder that exists ("": the flag
    without a PATH, a memory kept in the process only)."""
    from specdraft.drafters.memory import open_saved

    path = Path(value).expanduser()
    if not value:
        return value
    if not value.strip():
        raise argparse.ArgumentTypeError("the path is empty")
    if path.exists():
        try:
            open_saved(path).close()
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    elif not path.parent.is_dir():
        raise argparse.ArgumentTypeError(f"{path.parent} is not a folder, so {path} cannot be saved there")
    return value


def settings_from(args: argparse.Namespace, **worked_out) -> Settings:
    """The engine's settings from a command's options: every `Settings` field it has an option (or a
    default) for, under the field's name, and those it `worked_out` from several."""
    given = {field.name: getattr(args, field.name) for field in dataclasses.fields(Settings) if hasattr(args, field.name)}
    return Settings(**{**given, **worked_out})


def _unicode(text: str, what: str) -> str:
    """Text from the command line or stdin, refused where it is not valid UTF-8 (Python keeps each
    byte it cannot decode as a lone surrogate, U+DC80..U+DCFF)."""
    at = next((i for i, c in enumerate(text) if "\udc80" <= c <= "\udcff"), None)
    if at is None:
        return text
    raise ValueError(f"{what} is not valid UTF-8: the byte 0x{ord(text[at]) - 0xDC00:02x} at character {at}")


def _prompt(args: argparse.Namespace) -> str:
    if args.prompt != "-":
        return _unicode(args.prompt, "the prompt")
    return _unicode(sys.stdin.buffer.read().decode("utf-8", "surrogateescape"), "the prompt (stdin)")


def _check_models(args: argparse.Namespace) -> None:
    """Refuse a model or draft model that is not there, or not what it claims, in one line before
    anything heavy loads (`find.resolve`, which fetches a name on first use and hashes it again
    where it changed since it was verified, or with --verify)."""
    from specdraft.models import find

    find.resolve(args.model, verify=args.verify)
    if args.draft_model not in (None, find.SELF_DRAFT):
        find.resolve(args.draft_model, verify=args.verify)


def _generate(args: argparse.Namespace) -> int:
    from specdraft.params import ResponseFormat

    from specdraft.text import check_text

    prompt = check_text(_prompt(args))
    for stop in args.stop:
        _unicode(stop, "a --stop string")
    response_format = args.json_schema or (ResponseFormat.json_object() if args.json_object else None)
    params = SamplingParams(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        seed=args.seed,
        stop=tuple(args.stop),
        response_format=response_format,
    )
    settings = settings_from(args)
    _check_models(args)
    from specdraft.llm import LLM  # loads torch: after the cheap checks
    from specdraft.runtime import encode_prompt

    llm = LLM(args.model, settings)
    stream = llm.stream(encode_prompt(llm.tokenizer, prompt, chat=not args.no_chat), params)
    while True:
        try:
            delta = next(stream)
        except StopIteration as end:
            completion = end.value
            break
        if not args.json:
            sys.stdout.write(delta.text)
            sys.stdout.flush()
    grammar = completion.metrics.grammar
    if grammar is not None and not grammar.complete:
        print(f"specdraft: warning: the output ended ({completion.finish_reason}) before its JSON was complete; "
              "raise --max-tokens for the whole value", file=sys.stderr)
    if args.json:
        from specdraft.api.protocol import completion_json

        print(json.dumps(completion_json(completion)))
    else:
        m = completion.metrics
        sys.stdout.write("\n")
        print(
            f"[{len(completion.token_ids)} tokens, {m.tokens_per_second:.1f} tok/s, {m.steps} steps, "
            f"acceptance {m.acceptance_rate:.2f}, finish {completion.finish_reason}]",
            file=sys.stderr,
        )
    return 0


def _serve(args: argparse.Namespace) -> int:
    drafters = args.drafters or server_drafters()
    if args.drafter is not None and args.drafter not in drafters:
        drafters = [args.drafter, *drafters]
    options = dict(args.drafter_options or {})
    if args.ngram_memory is not None:  # an option of the ngram drafter, wherever it is used
        if not any(uses(name, "ngram") for name in drafters):
            raise ValueError("--ngram-memory needs the ngram or hybrid drafter among --drafters (or another built on ngram)")
        path = {"memory_path": args.ngram_memory} if args.ngram_memory else {}
        options["ngram"] = {**options.get("ngram", {}), "memory": True, **path}
    settings = settings_from(args, drafters=drafters, drafter_options=options)
    _check_models(args)
    import uvicorn

    from specdraft.api.gate import access_for
    from specdraft.api.server import create_app
    from specdraft.runtime import build_runtime

    limit = {} if args.max_body_bytes is None else {"max_body_bytes": args.max_body_bytes}
    access = access_for(args.host, args.api_key, args.allowed_hosts, **limit)  # before the model loads: a bad key fails fast
    runtime = build_runtime(args.model, settings)
    app = create_app(runtime, max_queued=args.max_queue, save_every=args.ngram_memory_save_every,
                     model_name=args.served_model_name, access=access)
    print(f"specdraft: serving {runtime.target.name} on http://{args.host}:{args.port} "
          f"(drafters: {', '.join(sorted(runtime.engine.drafters))}; default {runtime.drafter_name}, "
          f"k <= {settings.k}, policy {settings.policy}; costs {_calibration(runtime.engine.calibration)})",
          file=sys.stderr, flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0


def _calibration(how: str) -> str:
    """How the engine learnt this machine's costs at start, for the start-up line."""
    return {"measured": "measured at start", "kept": "as measured before (--recalibrate measures again)",
            "none": "not measured"}[how]


def _drafters(args: argparse.Namespace) -> int:
    """Every drafter with its origin, options (defaults as JSON, as --drafter-options takes them) and
    parts, then the plugins that were left out and why."""
    from specdraft.drafters import (REQUIRED, drafter_option_defaults, drafter_origin, drafter_parts, plugin_errors,
                                    takes_any_option)

    for name in drafter_names():
        listed = [f"{option} (required)" if default is REQUIRED else f"{option}={_as_json(default)}"
                  for option, default in drafter_option_defaults(name).items()]
        if takes_any_option(name):
            listed.append("any other option (unchecked)")
        print(f"{name}  ({drafter_origin(name)})\n  options: {', '.join(listed) or 'none'}")
        parts = drafter_parts(name)
        if parts:
            print("  parts: " + ", ".join(f"{part} (the {drafter} drafter, with its options)" for part, drafter in parts.items()))
    left_out = plugin_errors()
    if left_out:
        print("left out:")
    for name, why in left_out.items():
        print(f"  {name}  {why}")
    return 0


def _models(args: argparse.Namespace) -> int:
    """The models known by name, with their role, family, size and local file (or "not cached");
    `--fetch` fetches the named ones first."""
    from specdraft.models import find

    if args.files:
        from specdraft.models.verdict import print_verdicts

        return print_verdicts(args.files)
    if args.force and not args.fetch:
        raise ValueError("--force fetches again the models --fetch names; name them")
    for model in [find.entry(name) for name in args.fetch]:  # every name checked before any fetch
        print(f"{model.name}: {find.fetch(model, force=args.force)}", file=sys.stderr)
    if args.verify:
        verified = find.verify_cached()
        print(f"verified: {', '.join(m.name for m in verified) or 'no model is here'}", file=sys.stderr)
    rows = [(model, find.cached_path(model)) for model in find.CATALOGUE]
    if args.json:
        print(json.dumps([{"name": m.name, "role": m.role, "family": m.family, "bytes": m.size, "sha256": m.sha256,
                           "packages": m.packages_text, "description": m.description,
                           "path": str(path) if path else None} for m, path in rows], indent=2))
        return 0
    width = max(len(m.name) for m, _ in rows)
    for model, path in rows:
        print(f"{model.name:<{width}}  {model.role:<7}  {model.family:<6}  {model.size / 1e6:>6.0f} MB  "
              f"{path or 'not cached'}\n{'':<{width}}  {model.description}")
    return 0


def _as_json(value) -> str:
    try:
        return json.dumps(value)
    except TypeError:
        return repr(value)


COMMANDS = {"generate": _generate, "serve": _serve, "drafters": _drafters, "models": _models}


class _OneLine(logging.Formatter):
    """`specdraft: warning: ...`"""

    def format(self, record: logging.LogRecord) -> str:
        record.level = record.levelname.lower()
        return super().format(record)


def main(argv: list[str] | None = None) -> int:
    # specdraft's warnings (a plugin left out, ...) read as the CLI's other lines, on stderr
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_OneLine("specdraft: %(level)s: %(message)s"))
    logger = logging.getLogger("specdraft")
    logger.addHandler(handler)
    logger.setLevel(logging.WARNING)
    try:
        return _run(argv)
    finally:
        logger.removeHandler(handler)


def _run(argv: list[str] | None) -> int:
    args = build_parser().parse_args(argv)  # finds the plugins (the drafter choices)
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    from specdraft.errors import ModelNotFoundError, RequestError

    try:
        return COMMANDS[args.command](args)
    except (RequestError, ModelNotFoundError, ValueError) as exc:
        print(f"specdraft: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # the reader went away (`specdraft drafters | head`): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(main())

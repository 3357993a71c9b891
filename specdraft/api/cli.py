"""`specdraft` command line: `generate` (one prompt) and `serve` (the OpenAI-compatible server).

Options are parsed and checked here, once; bad input exits non-zero with one line naming it."""

from __future__ import annotations

import argparse
import json
import os
import sys

from specdraft.drafters import drafter_names


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


def _draft_length(value: str) -> int:
    from specdraft.params import check_num_speculative_tokens

    try:
        return check_num_speculative_tokens(int(value), "--num-speculative-tokens")
    except ValueError as exc:
        message = str(exc) if value.strip().lstrip("-").isdigit() else f"--num-speculative-tokens must be an integer, got {value!r}"
        raise argparse.ArgumentTypeError(message) from None


def add_model_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None, help="HF id, local directory or .gguf file (default: embedded SmolLM2-135M-Instruct)")
    parser.add_argument("--drafter", default="ngram", choices=drafter_names(), help="how drafts are proposed (none = plain decoding)")
    parser.add_argument("--draft-model", default=None,
                        help="draft model for the model and hybrid drafters: HF id, directory or .gguf sharing the "
                             "target's vocabulary (default: self-int8, an int8 copy of the target)")
    parser.add_argument("-k", "--num-speculative-tokens", type=_draft_length, default=5,
                        help="longest draft per step (0..64; 0 = plain decoding)")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda when present)")
    parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                        help="auto: float32 on CPU, bfloat16 on CUDA; float32 gives exact parity with plain decoding on a GPU")
    parser.add_argument("--enforce-eager", action="store_true", help="on CUDA, run steps without CUDA graphs")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="specdraft", description="Lossless speculative decoding with pluggable drafters.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    gen = sub.add_parser("generate", help="generate a completion for one prompt")
    gen.add_argument("prompt", help="the prompt text ('-' reads stdin)")
    add_model_options(gen)
    gen.add_argument("--max-tokens", type=_positive("--max-tokens"), default=128)
    gen.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--top-k", type=int, default=0)
    gen.add_argument("--seed", type=int, default=None)
    gen.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    gen.add_argument("--no-chat", action="store_true", help="raw completion instead of the chat template")
    gen.add_argument("--json", action="store_true", help="print one JSON object with text, token ids and metrics")

    serve = sub.add_parser("serve", help="serve an OpenAI-compatible completions API (SSE streaming)")
    add_model_options(serve)
    serve.add_argument("--drafters", type=_drafter_list, default=None,
                       help="comma-separated drafters requests may choose (default: none,ngram,model,hybrid)")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=_port, default=8000)
    serve.add_argument("--max-batch-size", type=_positive("--max-batch-size"), default=16, help="rows decoded together")
    serve.add_argument("--max-queue", type=_integer("--max-queue", 0), default=64,
                       help="requests that may wait for a row; beyond them a request gets 429")
    serve.add_argument("--max-model-len", type=_positive("--max-model-len"), default=None,
                       help="context length to serve (default: the model's)")
    serve.add_argument("--served-model-name", default=None, help="the model id clients send (default: the model's name)")
    serve.add_argument("--ngram-memory", nargs="?", const="", default=None, metavar="PATH",
                       help="let the ngram drafter draft from earlier requests' outputs; with PATH, load it from there "
                            "at start and save it there periodically and at shutdown")
    serve.add_argument("--ngram-memory-save-every", type=_positive("--ngram-memory-save-every"), default=300,
                       metavar="SECONDS")
    return parser


def _drafter_list(value: str) -> list[str]:
    names = [n.strip() for n in value.split(",") if n.strip()]
    unknown = [n for n in names if n not in drafter_names()]
    if not names or unknown:
        raise argparse.ArgumentTypeError(f"unknown drafter {unknown[0]!r}; choose from {', '.join(drafter_names())}"
                                         if unknown else "give at least one drafter")
    return names


def _port(value: str) -> int:
    return _integer("--port", 0, 65535)(value)


def _generate(args: argparse.Namespace) -> int:
    from specdraft.errors import RequestError
    from specdraft.params import SamplingParams

    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    if not prompt.strip():
        raise RequestError("prompt is empty")
    params = SamplingParams(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        seed=args.seed,
        stop=tuple(args.stop),
    )
    from specdraft.runtime import build_runtime, encode_prompt  # loads torch: after the cheap checks

    runtime = build_runtime(args.model, args.drafter, args.num_speculative_tokens, 1, args.device, args.dtype, args.draft_model,
                            enforce_eager=args.enforce_eager)
    engine = runtime.engine
    prompt_ids = encode_prompt(runtime.target.tokenizer, prompt, chat=not args.no_chat)
    request_id = engine.submit(prompt_ids, params)
    while engine.has_work:
        for delta in engine.step():
            if not args.json:
                sys.stdout.write(delta.text)
                sys.stdout.flush()
    completion = engine.collect(request_id)
    if args.json:
        print(json.dumps(completion.to_dict()))
    else:
        m = completion.metrics
        sys.stdout.write("\n")
        print(
            f"[{len(completion.token_ids)} tokens, {m['tokens_per_second']:.1f} tok/s, {m['steps']} steps, "
            f"acceptance {m['acceptance_rate']:.2f}, finish {completion.finish_reason}]",
            file=sys.stderr,
        )
    return 0


def _serve(args: argparse.Namespace) -> int:
    drafters = args.drafters or ["none", "ngram", "model", "hybrid"]
    if args.drafter not in drafters:
        drafters = [args.drafter, *drafters]
    if args.ngram_memory is not None and "ngram" not in drafters:
        raise ValueError("--ngram-memory needs the ngram drafter among --drafters")
    import uvicorn

    from specdraft.api.server import create_app
    from specdraft.runtime import build_runtime

    memory = None
    if args.ngram_memory is not None:
        memory = {"memory": True, **({"memory_path": args.ngram_memory} if args.ngram_memory else {})}
    runtime = build_runtime(args.model, args.drafter, args.num_speculative_tokens, args.max_batch_size, args.device,
                            args.dtype, args.draft_model, args.max_model_len, drafters=drafters, ngram_options=memory,
                            enforce_eager=args.enforce_eager)
    app = create_app(runtime, max_queued=args.max_queue, memory_path=args.ngram_memory or None,
                     save_every=args.ngram_memory_save_every, model_name=args.served_model_name)
    print(f"specdraft: serving {runtime.target.name} on http://{args.host}:{args.port} "
          f"(drafters: {', '.join(sorted(runtime.engine.drafters))}; default {args.drafter}, k <= {args.num_speculative_tokens})",
          file=sys.stderr, flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0


COMMANDS = {"generate": _generate, "serve": _serve}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    from specdraft.errors import ModelNotFoundError, RequestError

    try:
        return COMMANDS[args.command](args)
    except (RequestError, ModelNotFoundError, ValueError) as exc:
        print(f"specdraft: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())

"""Assemble a ready engine from a model and its `Settings` (`build_runtime`), and encode prompts."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

from specdraft.backend import StaticShapes, forward, worth_compiling
from specdraft.drafters import Drafter, Resources, create_drafter, is_builtin
from specdraft.engine import Engine, RequestError
from specdraft.engine.calibrate import KeptCalibration
from specdraft.grammar import GrammarCompiler
from specdraft.models import LoadedModel, Loading, load, load_draft, model_device, release_freed_memory
from specdraft.models.long_rope import original_context, use_context
from specdraft.params import cache_dir
from specdraft.settings import Resolved, Settings
from specdraft.text import check_text
from specdraft.verifier import Verifier

log = logging.getLogger("specdraft")


@dataclass
class Runtime:
    engine: Engine
    target: LoadedModel
    drafter_name: str  # the default drafter
    skipped: dict[str, str] = field(default_factory=dict)  # plugin drafters that failed to build: why
    resources: Resources = field(default_factory=Resources)  # what its drafters share; `save()` saves their state


def build_drafters(names: Sequence[str], k: int, target: LoadedModel, options: Mapping[str, Mapping[str, Any]],
                   resources: Resources) -> tuple[dict[str, Drafter], dict[str, str]]:
    """Build and warm each named drafter once, with its options (already resolved:
    `Settings.resolve_drafter_options`), all sharing `resources`. A plugin that fails to build is left
    out, with a warning naming it (returned as name -> why); a built-in one that fails raises."""
    drafters, skipped = {}, {}
    for name in names:
        try:
            drafters[name] = create_drafter(name, k=k, target=target, resources=resources, **options.get(name, {}))
        except Exception as exc:
            if is_builtin(name):
                raise
            skipped[name] = f"{type(exc).__name__}: {exc}"
            log.warning("drafter plugin %r failed to build and is left out: %s", name, skipped[name])
    return drafters, skipped


def build_runtime(model: str | LoadedModel | None = None, settings: Settings | None = None) -> Runtime:
    """The one assembly of an engine (the server, the CLI, `specdraft.LLM` and the benchmarks use it).
    model: a name, path or .gguf, or an already loaded `LoadedModel` (default: the embedded model);
    settings: the engine's options (default: `Settings()`), checked when they were made. It builds
    what `Settings.resolve` decides, and decides nothing itself."""
    plan = (settings or Settings()).resolve(model)
    target = model if plan.loading is None else load(plan.loading)
    context = plan.context(target.max_context, original_context(getattr(target.model, "config", None)))
    use_context(target.model, context)  # LongRoPE's factors: those of the context served
    static = static_shapes(target, plan.max_batch, context, graphs=plan.compiled)
    draft = None if plan.draft is None else load_draft(plan.draft, target)  # once, for every drafter built on `model`
    resources = Resources(static, compiled=plan.compiled, draft=draft)
    built, skipped = build_drafters(plan.drafters, plan.k, target, plan.drafter_options, resources)
    verifier = Verifier(target.model, static, compiled=plan.compiled and worth_compiling(target.model),
                        prefix_cache_bytes=plan.prefix_cache_bytes)
    grammar = GrammarCompiler(target.tokenizer, verifier.vocab_size, target.eos_token_ids)
    engine = Engine(verifier, built, target.tokenizer, target.eos_token_ids, context, k=plan.k,
                    max_batch=plan.max_batch, default_drafter=plan.default_drafter, policy=plan.policy,
                    calibrate=plan.calibrate, grammar=grammar, calibration=kept_calibration(plan))
    release_freed_memory()  # what building freed (draft copies' float32 transients) leaves the process
    return Runtime(engine, target, plan.default_drafter, skipped, resources)


def kept_calibration(plan: Resolved) -> KeptCalibration | None:
    """Where this start's calibration is kept (`engine.calibrate`): a file named by the hash of what the
    costs depend on (`calibration_key`), under `SPECDRAFT_CALIBRATION_DIR` (default the cache dir's
    `calibration/`); None where the target came loaded (nothing says which file it is) or the
    settings ask to measure afresh (`recalibrate`: measured, and kept for the next start); none either
    where an option is an object rather than a name or a path (a draft model given loaded)."""
    if plan.loading is None:
        return None
    key = calibration_key(plan)
    try:
        text = json.dumps(key, sort_keys=True)
    except TypeError:  # an option that names nothing lasting (a draft model given loaded): measured each start
        return None
    folder = Path(os.environ.get("SPECDRAFT_CALIBRATION_DIR", cache_dir() / "calibration"))
    name = hashlib.sha256(text.encode()).hexdigest()[:32]
    return KeptCalibration(folder / f"{name}.json", key, afresh=plan.recalibrate)


def calibration_key(plan: Resolved) -> dict[str, Any]:
    """Everything a calibration's timings depend on: the machine (its processor, threads, device), the
    code (ours, by content; torch's and numba's versions), the models (their files, by size and
    time of change) and how they load, the drafters and their options, k, the batch, the policy."""
    loading = plan.loading
    return {"machine": _processor(), "threads": torch.get_num_threads(), "device": _device_name(loading.device),
            "code": _code_hash(), "torch": torch.__version__, "python": platform.python_version(),
            "numba": _version("numba"),
            "target": {"name": loading.name, "file": _file(loading.source), "weights": loading.weights,
                       "arithmetic": loading.arithmetic, "dtype": str(loading.dtype)},
            "draft": _draft_key(plan.draft),
            "drafters": list(plan.drafters), "options": _with_files(plan.drafter_options), "k": plan.k,
            "max_batch": plan.max_batch, "policy": plan.policy, "compiled": plan.compiled}


def _draft_key(draft: Any) -> Any:
    """The draft model as the calibration depends on it: how it loads (a file by `_file`), its name
    (`self-int8`), None; a model given loaded as itself (which names nothing lasting: no kept calibration)."""
    if not isinstance(draft, Loading):
        return draft
    return {"name": draft.name, "file": _file(draft.source), "weights": draft.weights, "arithmetic": draft.arithmetic,
            "dtype": str(draft.dtype)}


def _processor() -> str:
    """The processor's model name and how many this machine has (Linux's /proc/cpuinfo; else platform's)."""
    try:
        info = Path("/proc/cpuinfo").read_text()
        names = [line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")]
        if names:
            return f"{names[0]} x{len(names)}"
    except OSError:
        pass
    return f"{platform.processor() or platform.machine()} x{os.cpu_count()}"


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else device.type


def _code_hash() -> str:
    """Our sources' content (Python, the compiled kernels' C++), hashed."""
    root = Path(__file__).parent
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        if path.suffix in (".py", ".cpp", ".h"):
            digest.update(str(path.relative_to(root)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


def _version(package: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return None


def _file(source: Path | str | os.PathLike) -> Any:
    """A model's source: a file or directory as its path, size and time of change; a name as it is."""
    path = Path(source)
    if not path.exists():
        return str(source)
    stat = path.stat()
    return [str(path.resolve()), stat.st_size, stat.st_mtime_ns]


def _with_files(options: Mapping[str, Any]) -> Any:
    """Drafter options with every string that names a file (a draft model's) as `_file` gives it."""
    if isinstance(options, Mapping):
        return {name: _with_files(value) for name, value in options.items()}
    if isinstance(options, (str, os.PathLike)) and os.path.exists(options):
        return _file(options)
    return options


def static_shapes(target: LoadedModel, max_batch: int, context: int, graphs: bool = True) -> StaticShapes | None:
    """Static shapes (a preallocated cache, and CUDA graphs unless `graphs` is False) where they pay:
    on CUDA, for models our own forward runs. On CPU a step is bound by the weights, not by launches,
    and the dynamic path (attending over exactly the rows' lengths) is faster."""
    if model_device(target).type != "cuda" or not forward.supports(target.model):
        return None
    return StaticShapes(max_rows=max_batch, max_context=context, graphs=graphs)


def encode_prompt(tokenizer, prompt: str | list[dict], chat: bool = True) -> list[int]:
    """Token ids for a prompt: chat-templated (a string becomes one user turn) or raw text. Text that is
    only whitespace is refused (`check_text`): it tokenizes to some tokens, which the engine's intake
    check (`Engine.resolve`) cannot tell from a prompt."""
    if isinstance(prompt, str):
        check_text(prompt)
    if chat and getattr(tokenizer, "chat_template", None):
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
        return [int(t) for t in ids]
    if not isinstance(prompt, str):
        raise RequestError("a list of messages needs a model with a chat template")
    return [int(t) for t in tokenizer(prompt).input_ids]

"""One call on a lent GPU machine measures what issues 42 and 55 ask for, into one report:
`benchmarks/results/gpu/report.md` and `report.json`, beside the sub-results the parts write there,
compared with the report committed before (`previous`), and (`--archive`) all of it in one tar.gz.

Parts, in this order, each a subprocess with a time budget (`BUDGETS`; a part may also use what the
parts before it left unused). A part that overruns is killed and reported as such (its figures so far
kept), and the next one runs; the script exits 0 whatever failed (the report says what did):
1. `choices`: `benchmarks.gpu.choices`: how the Triton kernels should launch (tiles, programmatic
   dependent launch), timed inside whole verify steps at the Llama-3.2-1B/-3B and Qwen2.5-Coder
   0.5B/1.5B shapes, and the 1B's int8 self-draft; it writes the fastest choice to `choice.txt`, and
   every later part runs under it (`SPECDRAFT_TRITON_CHOICE`): the tests test what was chosen;
2. `invariance`: the bitwise invariance tests (`INVARIANCE_TESTS`) with `SPECDRAFT_TEST_DEVICE=cuda`;
3. `cuda-tests`: the CUDA test subsets (`CUDA_TESTS`), likewise;
4. `domains`: the per-domain benchmark on the embedded model (bf16 on CUDA, greedy, prefix cache off,
   `DOMAIN_PROMPTS` prompts a domain, `DOMAIN_TOKENS` tokens): `DRAFTERS`, each with the default policy
   and with `policy="fixed"`, interleaved prompt by prompt (each prompt's prefill shapes captured first,
   untimed); tok/s, its ratio to `none`'s on the same prompt (medians), drafted and accepted tokens,
   and whether each method's token ids equal `none`'s.

How the machine gets here (see `scripts/gpu_prepare.py`): `prepare` here, then three `run` calls, the
last installing everything (`check`) and running this script:

    python scripts/gpu_prepare.py prepare
    run(carry=[".gpu/call1"], command="python3 scripts/gpu_prepare.py stage")
    run(carry=[".gpu/call2"], command="python3 scripts/gpu_prepare.py stage")
    run(carry=[".gpu/call3"], timeout_s=600, command="python3 scripts/gpu_prepare.py check; "
        "PYTHONUNBUFFERED=1 python3 scripts/gpu_run.py --archive $OUT/gpu.tar.gz")

`python scripts/gpu_run.py --rehearse` runs the same code paths on CPU at tiny sizes (the embedded
model in float32, tiny shapes, one prompt a domain, 16 tokens, the tests without the slow ones), into
`--out` (default there: a temporary folder).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks" / "results" / "gpu"
# Seconds each part may take on the GPU machine (455 in all: the call's limit is 600 s, and `check`
# runs before it in the same call), and in a rehearsal on a small CPU machine (where the tests overrun: that
# path is rehearsed too).
BUDGETS = {"choices": 220, "invariance": 60, "cuda-tests": 45, "domains": 130}
BUDGETS_REHEARSED = (240, 15, 15, 90)
INVARIANCE_TESTS = ("tests/backend/test_invariance.py", "tests/backend/test_triton_choice.py",
                    "tests/verifier/test_logprobs_invariance.py", "tests/engine/test_steady_steps.py")
CUDA_TESTS = ("tests/backend/test_static.py", "tests/verifier/test_acceptance.py", "tests/ground/test_seeded_sampling.py", "tests/engine/test_engine.py")
DRAFTERS = ("none", "ngram", "hybrid", "model")
POLICIES = (None, "fixed")  # None: the engine's default policy
CHOICE_FILE = "choice.txt"  # the `choices` part's pick, read by the parts after it
DOMAIN_PROMPTS, DOMAIN_TOKENS, DOMAIN_K = 3, 128, 5
TAIL = 3000  # characters of a part's output kept in the report (the whole of it: `<part>.log`)


@dataclass(frozen=True)
class Part:
    name: str
    command: tuple[str, ...]
    budget: float  # seconds
    env: tuple[tuple[str, str], ...] = ()
    kind: str = "command"  # "pytest": pass/fail counts are read from its output


@dataclass
class PartResult:
    name: str
    command: str
    seconds: float
    timeout: float
    returncode: int | None  # None: killed at its timeout
    tail: str
    counts: dict[str, int] = field(default_factory=dict)  # pytest's outcomes

    @property
    def status(self) -> str:
        if self.returncode is None:
            return "timed out"
        return "ok" if self.returncode == 0 else f"failed (exit {self.returncode})"


def parts(rehearse: bool, out: Path) -> list[Part]:
    """What one run does, at the GPU's sizes or (`rehearse`) at tiny sizes on CPU."""
    python = sys.executable
    device = () if rehearse else (("SPECDRAFT_TEST_DEVICE", "cuda"),)
    pytest = (python, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-rfE", *(("-m", "not slow") if rehearse else ()))
    choices = (("--shapes", "tiny-small,tiny-small-int8", "--pairs", "tiny-small-int8:tiny-small", "--hf", "tiny-small",
                "--batches", "1", "--choices", "default=;before=pdl=0,stages=3,target=128", "--rounds", "1", "--repeats", "1", "--context", "8")
               if rehearse else ())
    choices_env = (("TRITON_INTERPRET", "1"),) if rehearse else ()
    budget = dict(zip(BUDGETS, BUDGETS_REHEARSED if rehearse else BUDGETS.values()))
    return [
        Part("choices", (python, "-m", "benchmarks.gpu.choices", *choices, "--out", str(out),
                         "--choose", str(out / CHOICE_FILE)), budget["choices"], choices_env),
        Part("invariance", (*pytest, *INVARIANCE_TESTS), budget["invariance"], device, "pytest"),
        Part("cuda-tests", (*pytest, *CUDA_TESTS), budget["cuda-tests"], device, "pytest"),
        Part("domains", (python, str(Path(__file__).resolve()), "--part", "domains", "--out", str(out),
                         *(("--rehearse",) if rehearse else ())), budget["domains"]),
    ]


def chosen(out: Path) -> tuple[tuple[str, str], ...]:
    """The environment under which the parts after `choices` run: its pick, where it made one."""
    path = out / CHOICE_FILE
    return (("SPECDRAFT_TRITON_CHOICE", path.read_text().strip()),) if path.is_file() else ()


def run_part(part: Part, timeout: float, out: Path) -> PartResult:
    """Run `part` for at most `timeout` seconds (its whole process group is killed after), its output
    into `out/<name>.log`."""
    log = out / f"{part.name}.log"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TRANSFORMERS_VERBOSITY": "error", "HF_HUB_OFFLINE": "1",
           **dict(part.env)}
    start = time.monotonic()
    with log.open("wb") as sink:
        proc = subprocess.Popen(part.command, cwd=ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            returncode = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the part's own process group: pytest's or the benchmark's children too
            proc.wait()
            returncode = None
    text = log.read_text(errors="replace")
    env_shown = " ".join(f"{k}={v}" for k, v in part.env)
    return PartResult(part.name, f"{env_shown} {' '.join(part.command)}".strip(), time.monotonic() - start, timeout,
                      returncode, text[-TAIL:], pytest_counts(text) if part.kind == "pytest" else {})


OUTCOME = re.compile(r"(\d+) (passed|failed|errors?|skipped|xfailed|xpassed|deselected)\b")
VERBOSE = re.compile(r"^\S+::\S+.*? (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b", re.MULTILINE)


def pytest_counts(text: str) -> dict[str, int]:
    """Outcomes from pytest's last summary line ("3 passed, 1 failed in 2.0s"), or, where it never
    got there (killed), counted from its verbose lines so far (with "incomplete": 1)."""
    summaries = [line for line in text.splitlines() if re.search(r"\d+ (passed|failed|errors?|skipped)\b.* in [\d.]+s", line)]
    if summaries:
        counts: dict[str, int] = {}
        for number, outcome in OUTCOME.findall(summaries[-1]):
            counts["errors" if outcome == "error" else outcome] = int(number)
        return counts
    names = {"PASSED": "passed", "FAILED": "failed", "ERROR": "errors", "SKIPPED": "skipped", "XFAIL": "xfailed",
             "XPASS": "xpassed"}
    counts = {"incomplete": 1}
    for outcome in VERBOSE.findall(text):
        counts[names[outcome]] = counts.get(names[outcome], 0) + 1
    return counts


# -- the per-domain benchmark (run as `--part domains`, in its own process) ---------------------
def method_name(drafter: str, policy: str | None) -> str:
    return f"{drafter} ({policy or 'default'})"


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first index where two token sequences differ (one ending early counts), None if equal."""
    index = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    if index is None and len(a) != len(b):
        index = min(len(a), len(b))
    return index


def domain_benchmark(out: Path, rehearse: bool) -> None:
    """Every method on every prompt, interleaved; `out/domains.json` rewritten after each prompt, so
    that a run stopped at its budget leaves what it measured."""
    sys.path.insert(0, str(ROOT))  # run as a script: `benchmarks` is not installed
    import torch

    from benchmarks.common import machine
    from benchmarks.domains.datasets import DOMAINS, load_domain
    from benchmarks.domains.run import specdraft_llm
    from specdraft.models import load_model
    from specdraft.params import SamplingParams, SpeculationParams
    from specdraft.runtime import encode_prompt

    prompts, tokens = (1, 16) if rehearse else (DOMAIN_PROMPTS, DOMAIN_TOKENS)
    loaded = load_model(None, device=None, dtype="auto")  # bf16 on CUDA, float32 on CPU
    llm = specdraft_llm(loaded, DOMAIN_K, list(DRAFTERS), None)  # one prompt at a time, prefix cache off
    drafters = [d for d in DRAFTERS if d not in llm.runtime.skipped]
    methods = [(d, p) for d in drafters for p in POLICIES]
    result = {"machine": machine(), "model": loaded.name, "dtype": str(next(loaded.model.parameters()).dtype),
              "device": str(loaded.model.device), "k": DOMAIN_K, "max_tokens": tokens, "prompts_per_domain": prompts,
              "skipped": dict(llm.runtime.skipped), "methods": [method_name(*m) for m in methods], "rows": []}

    def generate(ids: list[int], drafter: str, policy: str | None, max_tokens: int) -> dict:
        start = time.perf_counter()
        [done] = llm.generate(ids, SamplingParams(max_tokens=max_tokens), SpeculationParams(drafter, policy=policy))
        seconds = time.perf_counter() - start
        m = done.metrics
        return {"token_ids": done.token_ids, "tokens": len(done.token_ids), "seconds": seconds,
                "tokens_per_second": len(done.token_ids) / seconds, "steps": m.steps, "draft_tokens": m.draft_tokens,
                "accepted_tokens": m.accepted_tokens, "finish_reason": done.finish_reason, "error": done.error,
                "first_token_ms": None if m.first_token is None else 1000 * (m.first_token - m.started),
                "draft_seconds": m.draft_seconds}

    warm = encode_prompt(loaded.tokenizer, "Say hello.")
    for drafter, policy in methods:  # first calls pay one-off allocation, compilation and capture
        generate(warm, drafter, policy, 8)
    for domain in DOMAINS:
        for prompt in load_domain(domain, prompts):
            ids = encode_prompt(loaded.tokenizer, prompt.messages)
            # Untimed, three times: the prompt's prefill passes (its last chunk's width is new) run eagerly
            # twice and are captured on the third, which would otherwise land on the first methods timed.
            for _ in range(3):
                generate(ids, "none", None, 1)
            for drafter, policy in methods:
                row = generate(ids, drafter, policy, tokens)
                result["rows"].append({"domain": domain, "id": prompt.id, "method": method_name(drafter, policy), **row})
            (out / "domains.json").write_text(json.dumps(result) + "\n")
    if torch.cuda.is_available():
        result["max_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
    (out / "domains.json").write_text(json.dumps(result) + "\n")


def summarise_domains(result: dict) -> list[dict]:
    """Per domain and method: median tok/s, the median of its per-prompt ratios to `none`'s (the
    default policy's, same prompt), drafted and accepted tokens, and how many prompts' token ids
    equal `none`'s (the first differing index of each that does not)."""
    reference = method_name("none", None)
    rows = result["rows"]
    plain = {(r["domain"], r["id"]): r for r in rows if r["method"] == reference}
    out = []
    for domain in dict.fromkeys(r["domain"] for r in rows):
        for method in result["methods"]:
            cell = [r for r in rows if r["domain"] == domain and r["method"] == method]
            if not cell:
                continue
            pairs = [(r, plain[(domain, r["id"])]) for r in cell if (domain, r["id"]) in plain]
            differences = [(r["id"], first_difference(r["token_ids"], p["token_ids"])) for r, p in pairs]
            out.append({
                "domain": domain, "method": method, "prompts": len(cell),
                "tokens_per_second": statistics.median(r["tokens_per_second"] for r in cell),
                "ratio_to_none": statistics.median(r["tokens_per_second"] / p["tokens_per_second"] for r, p in pairs)
                if pairs else None,
                "draft_tokens": sum(r["draft_tokens"] for r in cell),
                "accepted_tokens": sum(r["accepted_tokens"] for r in cell),
                "equal_to_none": sum(d is None for _, d in differences), "compared": len(differences),
                "first_differences": {i: d for i, d in differences if d is not None},
                "errors": [r["error"] for r in cell if r.get("error")],
            })
    return out


# -- the report --------------------------------------------------------------------------------
def render(report: dict) -> str:
    """The report's markdown: the parts, the per-domain table, the verify-step tables."""
    lines = [f"# One GPU run: tests, per-domain benchmark, verify step ({report['started']})", "",
             f"{report.get('machine') or 'machine not recorded'}; project at {report.get('commit') or 'an unknown commit'}"
             f"; budget {report['budget_s']:.0f} s, spent {report['seconds']:.0f} s. "
             "Made by `python3 scripts/gpu_run.py`" + (" --rehearse (CPU, tiny sizes)" if report["rehearse"] else "")
             + "; each part's whole output: `<part>.log` beside this file.", "",
             "| part | status | seconds (limit) | tests |", "| --- | --- | --- | --- |"]
    for part in report["parts"]:
        counts = ", ".join(f"{v} {k}" for k, v in part["counts"].items() if k != "incomplete")
        if part["counts"].get("incomplete"):
            counts = f"{counts or 'none'} so far (killed before its summary)"
        lines.append(f"| {part['name']} | {part['status']} | {part['seconds']:.0f} ({part['timeout']:.0f}) | {counts or '—'} |")
    failing = [p for p in report["parts"] if p["status"] != "ok"]
    for part in failing:
        lines += ["", f"## {part['name']}: {part['status']}", "", f"`{part['command']}`", "", "```",
                  part["tail"].strip()[-1500:], "```"]
    domains = report.get("domains")
    lines += ["", "## Per domain: the embedded model, greedy, prefix cache off", ""]
    if domains:
        lines += [f"{domains['model']}, {domains['dtype']} on {domains['device']}, k = {domains['k']}, "
                  f"{domains['max_tokens']} tokens, prompts a domain: {domains['prompts_per_domain']}; methods "
                  "interleaved prompt by prompt. Ratio: tok/s over `none (default)`'s on the same prompt, median. "
                  "Equal: prompts whose token ids equal `none (default)`'s (else the first differing index).", ""]
        if domains.get("skipped"):
            lines += [f"Left out: {domains['skipped']}", ""]
        lines += ["| domain | method | tok/s | ratio to none | drafted → accepted | equal to none | first differences |",
                  "| --- | --- | --- | --- | --- | --- | --- |"]
        for c in domains["summary"]:
            ratio = "—" if c["ratio_to_none"] is None else f"{c['ratio_to_none']:.2f}x"
            diffs = ", ".join(f"{i}: {d}" for i, d in c["first_differences"].items()) or "—"
            lines.append(f"| {c['domain']} | {c['method']} | {c['tokens_per_second']:.1f} | {ratio} | "
                         f"{c['draft_tokens']} → {c['accepted_tokens']} | {c['equal_to_none']}/{c['compared']} | {diffs} |")
    else:
        lines.append("Not measured (see the `domains` part above).")
    lines += ["", "## Verify step: kernel launch choices", ""]
    lines += [re.sub(r"^## ", "### ", report["choices_md"].split("\n", 1)[1].strip(), flags=re.M)] \
        if report.get("choices_md") else \
        ["Not measured (see the `choices` part above)."]
    return "\n".join(lines + render_previous(report)) + "\n"


def render_previous(report: dict) -> list[str]:
    """This run beside the last committed one: per-domain tok/s, and our batch-1 / batch-16 steps."""
    before = report.get("previous") or {}
    lines = ["", "## Against the last committed run", ""]
    now = {(c["domain"], c["method"]): c["tokens_per_second"] for c in (report.get("domains") or {}).get("summary", [])}
    rows = [(key, tps, now[key]) for key, tps in ((tuple(k.split(" | ")), v) for k, v in before.get("domains", {}).items())
            if key in now]
    if rows:
        lines += ["| domain | method | tok/s before | now | now / before |", "| --- | --- | --- | --- | --- |"]
        lines += [f"| {d} | {m} | {a:.0f} | {b:.0f} | {b / a:.2f}x |" for (d, m), a, b in rows] + [""]
    choices = (report.get("choices") or {}).get("models", {})
    best = (report.get("choices") or {}).get("best")
    steps = [(shape, cell, ms, choices[shape]["choices"].get(best, {}).get(cell, {}).get("step_ms"))
             for (shape, cell), ms in ((tuple(k.split(" | ")), v) for k, v in before.get("steps", {}).items())
             if shape in choices]
    if steps:
        lines += [f"| shape | batch, k | step ms before | now (`{best}`) |", "| --- | --- | --- | --- |"]
        lines += [f"| {shape} | {cell} | {ms:.2f} | {'—' if now_ms is None else f'{now_ms:.2f}'} |"
                  for shape, cell, ms, now_ms in steps]
    return lines if len(lines) > 3 else lines + ["No committed run to compare with."]


def previous(out: Path) -> dict:
    """The last committed run's figures in `out`, read before this run overwrites them: per-domain
    tok/s by "domain | method", and our step's ms by "shape | batch,k" (the fastest launch choice's, or
    before issue 55 the Triton kernels' with graphs on)."""
    found: dict = {}
    domains = out / "domains.json"
    if domains.is_file():
        summary_rows = summarise_domains(json.loads(domains.read_text()))
        found["domains"] = {f"{c['domain']} | {c['method']}": c["tokens_per_second"] for c in summary_rows}
    choices, step = out / "gpu_choices_cuda.json", out / "gpu_step_cuda.json"
    if choices.is_file():  # this script's own step figures: the fastest choice's
        raw = json.loads(choices.read_text())
        found["steps"] = {f"{shape} | {cell}": v["step_ms"] for shape, m in raw["models"].items()
                          for cell, v in m["choices"].get(raw.get("best"), {}).items()}
    elif step.is_file():  # before issue 55: benchmarks.gpu.step's
        models = json.loads(step.read_text())["models"]
        found["steps"] = {f"{shape} | {c['batch']},{c['k']}": c["ours_triton_graphs_on_ms"]
                          for shape, m in models.items() for c in m["cells"]
                          if c.get("ours_triton_graphs_on_ms") is not None and (c["batch"], c["k"]) in ((1, 0), (1, 5), (16, 5))}
    return found


def summary(report: dict) -> str:
    """A few lines for the end of the call's output."""
    lines = [f"{p['name']}: {p['status']}, {p['seconds']:.0f} s"
             + (f", {', '.join(f'{v} {k}' for k, v in p['counts'].items())}" if p["counts"] else "")
             for p in report["parts"]]
    for c in (report.get("domains") or {}).get("summary", []):
        ratio = "—" if c["ratio_to_none"] is None else f"{c['ratio_to_none']:.2f}x"
        lines.append(f"{c['domain']} {c['method']}: {c['tokens_per_second']:.0f} tok/s, {ratio}, "
                     f"equal {c['equal_to_none']}/{c['compared']}")
    return "\n".join(lines)


def collect(out: Path, results: list[PartResult], started: str, budget: float, seconds: float, rehearse: bool) -> dict:
    """The report's figures: the parts' results, and what the benchmarks wrote into `out`."""
    report = {"started": started, "rehearse": rehearse, "budget_s": budget, "seconds": seconds,
              "commit": git(["rev-parse", "--short", "HEAD"]), "dirty": bool(git(["status", "--porcelain"])),
              "parts": [{**asdict(r), "status": r.status} for r in results]}
    domains = out / "domains.json"
    if domains.is_file():
        raw = json.loads(domains.read_text())
        report["machine"] = raw["machine"]
        report["domains"] = {k: v for k, v in raw.items() if k != "rows"} | {"summary": summarise_domains(raw)}
    # benchmarks.gpu.choices writes `gpu_choices_<device type>`
    found = [out / f"gpu_choices_{kind}.json" for kind in ("cuda", "cpu") if (out / f"gpu_choices_{kind}.json").is_file()]
    if found:
        report["choices"] = json.loads(found[0].read_text())
        report.setdefault("machine", report["choices"]["machine"])
        report["choices_md"] = found[0].with_suffix(".md").read_text()
    return report


def git(args: list[str]) -> str | None:
    try:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def write_report(out: Path, report: dict) -> None:
    (out / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    (out / "report.md").write_text(render(report))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rehearse", action="store_true", help="on CPU at tiny sizes (the same code paths)")
    parser.add_argument("--out", type=Path, default=None, help=f"default: {OUT.relative_to(ROOT)} (--rehearse: a temporary folder)")
    parser.add_argument("--budget", type=float, default=None, help="seconds for every part, shared in proportion to "
                        f"their budgets (default {sum(BUDGETS.values())}; --rehearse: {sum(BUDGETS_REHEARSED)})")
    parser.add_argument("--archive", type=Path, default=None, help="also write the whole output folder here (.tar.gz)")
    parser.add_argument("--parts", default=",".join(BUDGETS), help=f"which parts to run, of {', '.join(BUDGETS)} "
                        "(without `choices`, the later parts run under the default choice)")
    parser.add_argument("--part", choices=["domains"], help=argparse.SUPPRESS)  # one part, in its own process
    args = parser.parse_args()
    out = args.out or (Path(tempfile.mkdtemp(prefix="specdraft-gpu-run-")) if args.rehearse else OUT)
    out.mkdir(parents=True, exist_ok=True)
    if args.part == "domains":
        domain_benchmark(out, args.rehearse)
        return 0
    wanted = [p.strip() for p in args.parts.split(",") if p.strip()]
    if unknown := sorted(set(wanted) - set(BUDGETS)):
        parser.error(f"unknown parts {unknown}: of {', '.join(BUDGETS)}")
    plan = [p for p in parts(args.rehearse, out) if p.name in wanted]
    budget = args.budget or sum(p.budget for p in plan)
    scale = budget / sum(p.budget for p in plan)
    started = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    start = time.monotonic()
    before = previous(out)
    (out / CHOICE_FILE).unlink(missing_ok=True)
    results = []
    for i, part in enumerate(plan):
        # All the time left, less what the later parts are promised: time an early part leaves unused goes on.
        timeout = max(1.0, budget - (time.monotonic() - start) - scale * sum(p.budget for p in plan[i + 1:]))
        part = Part(part.name, part.command, part.budget, part.env + (chosen(out) if i else ()), part.kind)
        print(f"gpu_run: {part.name} (at most {timeout:.0f} s) {dict(part.env)}", flush=True)
        results.append(run_part(part, timeout, out))
        print(f"gpu_run: {part.name}: {results[-1].status} in {results[-1].seconds:.0f} s", flush=True)
    report = collect(out, results, started, budget, time.monotonic() - start, args.rehearse)
    report["previous"] = before
    write_report(out, report)
    print(summary(report))
    print(f"gpu_run: wrote {out / 'report.md'}")
    if args.archive:
        with tarfile.open(args.archive, "w:gz") as tar:
            tar.add(out, arcname=out.name)
        print(f"gpu_run: archived {out} in {args.archive}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

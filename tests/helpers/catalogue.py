"""A catalogue entry of a test model in parts (`entry`, each part's bytes `chunk(i)`), the files of a
part package as published (`write_part`), and an installer that writes them as pip would, without pip
(`fake_installer`)."""

from __future__ import annotations

import hashlib
from pathlib import Path

from specdraft.models.find import Catalogued

PARTS = 12  # more than 9: numeric order and lexicographic order differ (part2 before part10)
MARKER = "IMPORTED"  # written by a part package's code if anything imports it


def chunk(i: int) -> bytes:
    return bytes([i]) * (100 + i)  # each part its own bytes and length


def entry(parts: int = PARTS, package: str = "sd-test-part", **changes) -> Catalogued:
    data = b"".join(chunk(i) for i in range(1, parts + 1))
    fields = dict(name="test-model", role="target", family="llama", description="a test model", size=len(data),
                  sha256=hashlib.sha256(data).hexdigest(), package=package, version="1.0",
                  file="test-model.gguf", parts=parts)
    return Catalogued(**{**fields, **changes})


def write_part(root: Path, module: str, i: int) -> dict[str, bytes]:
    """A part package's files (the layout of the published ones): its module, whose code would leave
    a marker if it ran, and `data/partN.bin` (not zero-padded, so file names sort 1, 10, 11, 12, 2)."""
    files = {f"{module}/__init__.py": f"open({str(root / MARKER)!r}, 'w').close()\n"
                                      "def get_part_path():\n    raise AssertionError('never called')\n".encode(),
             f"{module}/data/part{i}.bin": chunk(i)}
    return files


def fake_installer(calls: list):
    """Writes the parts' installed trees as pip would, without pip; `calls` records each install."""

    def install(requirements, target: Path) -> None:
        calls.append(list(requirements))
        for i, requirement in enumerate(requirements, 1):
            module = requirement.split("==")[0].replace("-", "_")
            for name, data in write_part(target, module, i).items():
                (target / name).parent.mkdir(parents=True, exist_ok=True)
                (target / name).write_bytes(data)

    return install

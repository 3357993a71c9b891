"""Shared fixtures: a tiny random Llama and its greedy references (made by `tests.helpers.tiny`), and
the embedded SmolLM2 model for end-to-end checks."""

from __future__ import annotations

import os
import tempfile

# On CPU the Triton kernels' tests run them under Triton's interpreter, which must be chosen before
# anything imports triton (torch's inductor does, and triton reads the choice once).
if os.environ.get("SPECDRAFT_TEST_DEVICE", "cpu") == "cpu":
    os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402

from tests.helpers.prompts import PROMPTS  # noqa: E402
from tests.helpers.tiny import hf_greedy, make_tiny_model  # noqa: E402

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
# Calibrations kept by one test session are not replayed by the next: each session measures afresh.
os.environ.setdefault("SPECDRAFT_CALIBRATION_DIR", tempfile.mkdtemp(prefix="specdraft-calibration-"))


@pytest.fixture(scope="session")
def tiny_model():
    return make_tiny_model()


@pytest.fixture(scope="module")
def references(tiny_model):
    """`tests.helpers.prompts.PROMPTS`' plain greedy continuations (40 tokens) on `tiny_model`."""
    return {tuple(p): hf_greedy(tiny_model, p, 40) for p in PROMPTS}


@pytest.fixture(scope="session")
def embedded():
    """The embedded SmolLM2-135M-Instruct, fp32 on CPU (converted once into the cache dir), as
    specdraft loads it (native: its Q4_1/Q8_0 layers read as the GGUF's blocks) in the float32
    arithmetic: the dense model's logits bitwise, which Hugging Face parity is tested on."""
    from specdraft.models import load_model

    return load_model(None, device="cpu", dtype="float32", arithmetic="float32")


@pytest.fixture(scope="session")
def embedded_int8():
    """The embedded model as specdraft loads it by default on CPU: native weights computing in the
    int8 arithmetic (its own logits, not Hugging Face's)."""
    from specdraft.models import load_model

    return load_model(None, device="cpu", dtype="float32", arithmetic="int8")


@pytest.fixture(scope="session")
def embedded_stock():
    """The same model as stock Hugging Face runs it: the reference for end-to-end equality."""
    from specdraft.models import load_model

    return load_model(None, device="cpu", dtype="float32", few_rows_linears=False, weights="dense")

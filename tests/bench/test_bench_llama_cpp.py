"""The llama.cpp peer: its commands, and what it reads back from a run (the text after the prompt as
our tokenizer's ids, its reported times and draft counts), checked against a stand-in binary that
writes what llama.cpp's tools write; a missing binary or a failed run is an error that says so."""

from __future__ import annotations

import stat

import pytest

from benchmarks.peers import llama_cpp

PROMPT = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


class Words:
    """A stand-in tokenizer: a token a word."""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [len(word) for word in text.split()]


def fake_tool(folder, name: str, output: str, stderr: str, code: int = 0):
    """A script named like a llama.cpp tool that echoes the prompt (as they do), then `output`, and
    writes `stderr`; its arguments are kept in args.txt."""
    path = folder / name
    path.write_text("#!/usr/bin/env python3\nimport sys\n"
                    f"open({str(folder / 'args.txt')!r}, 'w').write('\\n'.join(sys.argv[1:]))\n"
                    "prompt = sys.argv[sys.argv.index('-p') + 1]\n"
                    f"sys.stdout.write(prompt + {output!r} + '\\n\\n')\n"
                    f"sys.stderr.write({stderr!r})\nsys.exit({code})\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


REPORT = ("I encoded   29 tokens in    0.500 seconds, speed:  58.000 t/s\n"
          "I decoded   10 tokens in    2.000 seconds, speed:   5.000 t/s\n"
          "I n_draft      = 5\nI n_drafted    = 15\nI n_accept     = 6\n")


def test_a_run_reads_back_the_text_after_the_prompt_and_the_reported_speed(tmp_path):
    for name in ("llama-lookup", "llama-speculative"):
        fake_tool(tmp_path, name, "one three fives", REPORT)
    found = llama_cpp.methods(tmp_path, tmp_path / "t.gguf", tmp_path / "d.gguf", 5)
    assert list(found) == ["llama.cpp-plain", "llama.cpp-lookup-k5", "llama.cpp-speculative-k5"]
    assert found["llama.cpp-speculative-k5"][-4:] == ["-md", str(tmp_path / "d.gguf"), "--spec-draft-n-max", "5"]
    row = llama_cpp.run(found["llama.cpp-lookup-k5"], PROMPT, 10, 2, Words())
    assert row["token_ids"] == [3, 5, 5]
    assert row["decode_tokens_per_second"] == pytest.approx(10 / 2.0)
    assert row["tokens_per_second"] == pytest.approx(10 / 2.5) and row["seconds"] == pytest.approx(2.5)
    assert (row["draft_tokens"], row["accepted_tokens"]) == (15, 6)
    args = (tmp_path / "args.txt").read_text().split("\n")
    assert args[args.index("-n") + 1] == "9" and args[args.index("-t") + 1] == "2"  # 10 tokens, the first from the prompt
    assert args[args.index("--temp") + 1] == "0" and args[args.index("--spec-draft-n-max") + 1] == "5"


def test_tuned_speculation_is_draft_simple_at_each_length_with_its_probability_floor(tmp_path):
    for name in ("llama-lookup", "llama-speculative"):
        fake_tool(tmp_path, name, "x", REPORT)
    found = llama_cpp.methods(tmp_path, tmp_path / "t.gguf", tmp_path / "d.gguf", 5, (3, 16), 0.75)
    assert list(found)[2:] == ["llama.cpp-speculative-k5", "llama.cpp-speculative-k3-p0.75",
                               "llama.cpp-speculative-k16-p0.75"]
    tuned = found["llama.cpp-speculative-k16-p0.75"]
    assert tuned[tuned.index("-md") + 1] == str(tmp_path / "d.gguf") and tuned[tuned.index("--spec-type") + 1] == "draft-simple"
    assert tuned[tuned.index("--spec-draft-n-max") + 1] == "16" and tuned[tuned.index("--spec-draft-p-min") + 1] == "0.75"
    assert "--spec-draft-p-min" not in found["llama.cpp-speculative-k5"]  # as the tool ships it


def test_other_ngram_drafters_are_speculative_simple_by_type_and_need_their_binary(tmp_path):
    fake_tool(tmp_path, "llama-lookup", "x", REPORT)
    with pytest.raises(FileNotFoundError, match="llama-speculative-simple"):
        llama_cpp.methods(tmp_path, tmp_path / "t.gguf", None, 5, ngram_types=("ngram-mod",))
    fake_tool(tmp_path, "llama-speculative-simple", "x", REPORT)
    found = llama_cpp.methods(tmp_path, tmp_path / "t.gguf", None, 5, ngram_types=("ngram-mod", "ngram-map-k"))
    assert found["llama.cpp-ngram-mod"] == [str(tmp_path / "llama-speculative-simple"), "-m", str(tmp_path / "t.gguf"),
                                            "--spec-type", "ngram-mod"]
    assert list(found)[2:] == ["llama.cpp-ngram-mod", "llama.cpp-ngram-map-k"]


def test_an_output_past_the_budget_is_compared_within_it(tmp_path):
    """A drafting tool stops after the step that passes the budget: its extra tokens are not its output's."""
    fake_tool(tmp_path, "llama-lookup", "one three fives sevennn", REPORT)
    [_, lookup] = llama_cpp.methods(tmp_path, tmp_path / "t.gguf", None, 3).values()
    assert llama_cpp.run(lookup, PROMPT, 3, 2, Words())["token_ids"] == [3, 5, 5]


def test_no_draft_model_no_speculation_and_a_missing_binary_is_named(tmp_path):
    fake_tool(tmp_path, "llama-lookup", "x", REPORT)
    assert list(llama_cpp.methods(tmp_path, tmp_path / "t.gguf", None, 3)) == ["llama.cpp-plain", "llama.cpp-lookup-k3"]
    with pytest.raises(FileNotFoundError, match="llama-speculative"):
        llama_cpp.methods(tmp_path, tmp_path / "t.gguf", tmp_path / "d.gguf", 3)


def test_a_failed_or_silent_run_says_why(tmp_path):
    fake_tool(tmp_path, "llama-lookup", "x", "error: failed to load model\n", code=1)
    [argv, _] = llama_cpp.methods(tmp_path, tmp_path / "t.gguf", None, 3).values()
    with pytest.raises(RuntimeError, match="failed to load model"):
        llama_cpp.run(argv, PROMPT, 10, 2, Words())
    fake_tool(tmp_path, "llama-lookup", "x", "nothing timed\n")
    with pytest.raises(RuntimeError, match="no decode time"):
        llama_cpp.run(argv, PROMPT, 10, 2, Words())

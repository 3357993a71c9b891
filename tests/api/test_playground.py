"""The playground page (`GET /`) in a real headless browser against a live server on the embedded
model: streamed text appears, accepted draft tokens are shaded, the stats update live and then
settle on the server's exact counts, "compare" shows both speeds, and errors reach the page.

Needs Debian's chromium at /usr/bin/chromium and the Python package playwright (both installed by
`bash scripts/setup_browser.sh`); without either, the tests skip and say which piece is missing.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import httpx
import pytest

from benchmarks.common import live_server

pytestmark = [pytest.mark.slow, pytest.mark.subprocess]

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
# The compare test's screenshot goes to a temporary folder, so that the suite leaves the checkout as it
# found it; SPECDRAFT_SCREENSHOT_DIR=benchmarks/results/serving refreshes the committed one.
SCREENSHOT_DIR = os.environ.get("SPECDRAFT_SCREENSHOT_DIR")
# The embedded model copies it whole in either arithmetic (a list to repeat was copied in one and
# answered otherwise in another, as attention's summation order changed).
COPY_PROMPT = 'Copy this JSON exactly: {"name": "alpha", "id": 1, "tags": ["red", "green", "blue"]}'
MAX_TOKENS = 48
WAIT_MS = 180_000  # one run of MAX_TOKENS tokens on a busy 2-core machine, with room to spare
NUMBER = re.compile(r"^\d+(\.\d+)?$")


@pytest.fixture(scope="module")
def sync_playwright():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("the Python package playwright is not installed: bash scripts/setup_browser.sh "
                    "(or pip install playwright) installs it")
    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip(f"Debian's chromium is not installed at {CHROMIUM}: apt-get install chromium "
                    "(bash scripts/setup_browser.sh does it when run as root)")
    return sync_playwright


@pytest.fixture(scope="module")
def server(sync_playwright):
    with live_server("--device", "cpu", "--dtype", "float32", "--max-batch-size", "2") as url:
        yield url


@pytest.fixture(scope="module")
def playwright(sync_playwright):
    """One Playwright for the module (a second one started inside the first refuses to run)."""
    with sync_playwright() as playwright:
        yield playwright


@pytest.fixture(scope="module")
def page(playwright, server):
    """The playground, loaded; `page.errors` collects uncaught script errors."""
    browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
    page = browser.new_page(viewport={"width": 1280, "height": 860})
    page.errors = []
    page.on("pageerror", lambda exc: page.errors.append(str(exc)))
    page.set_default_timeout(WAIT_MS)
    page.goto(server + "/")
    page.wait_for_selector("body[data-ready=true]")
    yield page
    browser.close()


def fill(page, mode: str, drafter: str, prompt: str = COPY_PROMPT, k: str = "5", max_tokens: int = MAX_TOKENS) -> None:
    page.select_option("#mode", mode)
    page.select_option("#drafter", drafter)
    page.fill("#prompt", prompt)
    page.fill("#k", k)
    page.fill("#temperature", "0")
    page.fill("#max-tokens", str(max_tokens))


def stat(page, pane: str, name: str) -> str:
    return page.text_content(f"#{pane} .{name}").strip()


def test_root_serves_the_page_and_lists_the_drafters(server):
    response = httpx.get(server + "/")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    assert "specdraft playground" in response.text
    assert "<script src" not in response.text and "<link rel=\"stylesheet\"" not in response.text  # self-contained
    drafters = httpx.get(server + "/v1/models").json()["data"][0]["drafters"]
    assert {"none", "ngram"} <= set(drafters)


def test_ngram_run_streams_shaded_accepted_tokens_and_live_stats(page, server):
    options = page.eval_on_selector_all("#drafter option", "options => options.map(o => o.value)")
    assert options == httpx.get(server + "/v1/models").json()["data"][0]["drafters"]
    assert page.input_value("#drafter") == "ngram"  # the default choice when the server has it
    fill(page, "chat", "ngram")
    # Record every value the tokens/s and steps stats show, to see them change while streaming.
    page.evaluate("""() => {
        window.seen = {tps: [], steps: []};
        for (const name of ["tps", "steps"]) {
            const el = document.querySelector("#pane-a ." + name);
            new MutationObserver(() => window.seen[name].push(el.textContent))
                .observe(el, {childList: true, characterData: true, subtree: true});
        }
    }""")
    page.click("#run")
    page.wait_for_selector("#pane-a .out span")  # streamed text appears before the run ends
    page.wait_for_selector("#pane-a[data-state=done]")

    text = page.text_content("#pane-a .out")
    assert text.strip()
    reference = httpx.post(server + "/v1/chat/completions", timeout=WAIT_MS / 1000, json={
        "messages": [{"role": "user", "content": COPY_PROMPT}], "max_tokens": MAX_TOKENS, "temperature": 0,
        "speculation": {"drafter": "ngram", "num_speculative_tokens": 5}}).json()
    assert text == reference["choices"][0]["message"]["content"]  # greedy: the page shows exactly the answer

    drafted = page.locator("#pane-a .out .drafted")
    assert drafted.count() > 0, "no accepted draft tokens shaded on a copy-heavy prompt"
    assert "".join(drafted.all_text_contents()).strip()

    seen = page.evaluate("window.seen")
    assert any(v.startswith("≈") for v in seen["tps"]), f"no live tokens/s estimate shown: {seen['tps']}"
    assert len({v for v in seen["steps"] if v.isdigit()}) >= 3, f"the step count did not count up: {seen['steps']}"
    # The final stats are the stream's usage: exact, and consistent with each other. (Steps and drafts
    # can differ from the reference request's: the draft length adapts to measured step costs.)
    assert stat(page, "pane-a", "tokens") == str(reference["usage"]["completion_tokens"])
    drafts, accepted = map(int, re.search(r"(\d+) drafted, (\d+) accepted", page.text_content("#pane-a .state")).groups())
    steps = int(stat(page, "pane-a", "steps"))
    assert accepted > 0 and steps >= 1
    # The page shows usage's rates (rounded to 4 places by the server) to 1 and 2 places: compare with
    # the same rounded value, so a tie such as 0.3415 -> "34.2%" is within the display's half-unit.
    assert float(stat(page, "pane-a", "acceptance").removesuffix("%")) == pytest.approx(100 * round(accepted / drafts, 4), abs=0.0501)
    assert float(stat(page, "pane-a", "mean-accepted")) == pytest.approx(round(accepted / steps, 4), abs=0.00501)
    assert float(stat(page, "pane-a", "tps")) > 0
    assert page.errors == []


def test_compare_shows_both_speeds(page, tmp_path):
    fill(page, "chat", "ngram")
    page.click("#compare")
    page.wait_for_selector("#pane-b[data-state=done]")
    assert page.get_attribute("#pane-a", "data-state") == "done"
    assert page.text_content("#pane-a .title").startswith("none")
    assert page.text_content("#pane-b .title").startswith("ngram")
    plain, drafted = stat(page, "pane-a", "tps"), stat(page, "pane-b", "tps")
    assert NUMBER.match(plain) and float(plain) > 0
    assert NUMBER.match(drafted) and float(drafted) > 0
    assert page.locator("#pane-a .out .drafted").count() == 0  # `none` never drafts
    assert page.locator("#pane-b .out .drafted").count() > 0
    assert stat(page, "pane-a", "acceptance") == "n/a"
    assert page.text_content("#pane-a .out") == page.text_content("#pane-b .out")  # lossless: same greedy text
    summary = page.text_content("#summary")
    assert re.search(rf"ngram: {drafted} tokens/s vs none: {plain} tokens/s \(\d+\.\d\d× speed-up\)", summary), summary
    assert page.errors == []
    folder = Path(SCREENSHOT_DIR) if SCREENSHOT_DIR else tmp_path
    folder.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(folder / "playground.png"), full_page=True)
    assert (folder / "playground.png").stat().st_size > 0


def test_raw_completion_mode_streams(page):
    fill(page, "completion", "ngram", prompt="alpha, beta, gamma, delta, alpha, beta, gamma, delta, alpha,", max_tokens=12)
    page.click("#run")
    page.wait_for_selector("#pane-a[data-state=done]")
    assert page.text_content("#pane-a .out").strip()
    assert page.is_hidden("#pane-b")  # a single run shows one pane
    assert page.errors == []


def test_stop_ends_the_run_and_says_so(page, server):
    fill(page, "chat", "none", max_tokens=64)  # plain decoding: at least 3 s more to run when stopped
    page.click("#run")
    page.wait_for_selector("#pane-a .out span")
    page.click("#stop")
    page.wait_for_selector("#pane-a[data-state=error]")
    assert page.text_content("#pane-a .state") == "stopped"
    assert page.text_content("#error") == ""  # stopping is not an error
    assert page.is_enabled("#run") and page.is_disabled("#stop")
    deadline = time.monotonic() + 1.5
    while httpx.get(server + "/health").json()["running"]:  # the server cancels the abandoned request
        assert time.monotonic() < deadline, "the stopped request still holds a row"
        time.sleep(0.2)


def test_server_errors_are_shown_on_the_page(page):
    fill(page, "chat", "ngram", k="65")
    page.click("#run")
    page.wait_for_selector("#pane-a[data-state=error]")
    message = page.text_content("#error")
    assert message.startswith("400: ") and "num_speculative_tokens" in message, message
    assert "num_speculative_tokens" in page.text_content("#pane-a .out .error")
    assert page.is_enabled("#run")  # ready for the next try


def test_behind_an_api_key_the_browser_asks_for_it_and_the_page_runs(playwright):
    """With --api-key the page answers 401 asking for Basic credentials; given the key as the password,
    the browser loads the page and sends the key with the page's own requests (models, a stream)."""
    key = "playground-test-key"
    with live_server("--device", "cpu", "--dtype", "float32", "--max-batch-size", "1", "--api-key", key) as url:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            refused = httpx.get(url + "/", timeout=30)
            assert refused.status_code == 401 and refused.headers["www-authenticate"].startswith("Basic")
            page = browser.new_context(http_credentials={"username": "me", "password": key}).new_page()
            page.set_default_timeout(WAIT_MS)
            assert page.goto(url + "/").status == 200
            page.wait_for_selector("body[data-ready=true]")
            fill(page, "completion", "ngram", prompt="one, two, one, two, one,", max_tokens=6)
            page.click("#run")
            page.wait_for_selector("#pane-a[data-state=done]")
            assert page.text_content("#pane-a .out").strip()
        finally:
            browser.close()

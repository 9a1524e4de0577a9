"""The /attention/view page in a real headless Chromium, against a real `headwise serve` process
on the tiny bundle (2 layers, 4 heads), with an API key set so that the page's key input counts.

Needs Debian's chromium (`make system-deps`); playwright drives it, no browser is downloaded.
Screenshots go to artifacts/ under the repository root.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.live import Live, serve

pytestmark = pytest.mark.browser

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
API_KEY = "browser-test-key"
TEXT = "The cat sat on the mat."
ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"
WAIT_MS = 15_000


@pytest.fixture(scope="module")
def browser() -> Iterator:
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} is missing: install Debian's chromium (make system-deps)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright package")
    with sync_api.sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture(scope="module")
def live(browser, tiny_bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    tmp = tmp_path_factory.mktemp("viewer")
    with serve(tiny_bundle, tmp, env={"HEADWISE_API_KEY": API_KEY}, ready_s=60) as server:
        yield server


@pytest.fixture
def page(browser, live: Live) -> Iterator:
    context = browser.new_context(viewport={"width": 1360, "height": 900})
    context.set_default_timeout(WAIT_MS)
    pg = context.new_page()
    pg.js_errors = []
    pg.on("pageerror", lambda exc: pg.js_errors.append(str(exc)))
    pg.goto(f"{live.url}/attention/view")
    try:
        yield pg
    finally:
        context.close()


def post(live: Live, path: str, body: dict) -> dict:
    r = httpx.post(
        f"{live.url}{path}", json=body, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=30
    )
    assert r.status_code == 200, r.text
    return r.json()


def enter_key(page) -> None:
    page.fill("#apikey", API_KEY)
    page.press("#apikey", "Tab")  # "change": the page stores the key and asks /info again
    page.wait_for_function(
        "document.querySelectorAll('#layer option').length === 2"
        " && document.querySelectorAll('#head option').length === 4"
    )
    assert page.locator("#error").is_hidden()


def wait_state(page, state: str) -> None:
    page.wait_for_selector(f"#app[data-state='{state}']")


def screenshot(page, name: str) -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / name
    page.screenshot(path=str(path), full_page=True)
    print(f"screenshot: {path}")
    return path


def test_heatmap_stats_importance_and_small_multiples(page, live: Live) -> None:
    tokens = post(live, "/tokenize", {"inputs": TEXT})["results"][0]["tokens"]
    n = len(tokens)
    assert n > 5

    # Without the key, the server's 401 is shown in the page.
    error = page.locator("#error")
    error.wait_for(state="visible")
    assert "401" in error.inner_text()

    enter_key(page)
    assert page.evaluate("localStorage.getItem('headwise.apiKey')") == API_KEY
    sent: list[dict] = []  # the bodies of the page's POST /attention requests

    def record(request) -> None:
        if request.method == "POST" and request.url.endswith("/attention"):
            sent.append(json.loads(request.post_data))

    page.on("request", record)

    page.fill("#text", TEXT)
    page.select_option("#layer", "1")
    page.select_option("#head", "2")
    page.get_by_role("button", name="Show").click()
    wait_state(page, "ready")

    # The heatmap: one rect.cell per (query, key), labelled with the tokens on both axes.
    assert page.locator("#heatmap rect.cell").count() == n * n
    assert page.locator("#heatmap text.xlabel").all_text_contents() == tokens
    assert page.locator("#heatmap text.ylabel").all_text_contents() == tokens
    assert "Layer 1 · head 2" in page.locator("#map-title").inner_text()

    # The page asked for the selected layer only, and draws that head's weights.
    assert [b["layers"] for b in sent] == [[1]]
    assert sent[0]["input"] == TEXT
    drawn = page.evaluate(
        "[...document.querySelectorAll('#heatmap rect.cell')]"
        ".map(r => [+r.dataset.q, +r.dataset.k, +r.dataset.w])"
    )
    ref = post(live, "/attention", {"input": TEXT, "layers": [1], "heads": [2]})["attentions"][0][0]
    for q, k, w in drawn:
        assert w == pytest.approx(ref[q][k], abs=1e-6)
    for q in range(n):
        assert sum(w for qq, _, w in drawn if qq == q) == pytest.approx(1.0, abs=1e-2)

    # Hovering a cell says which query looks at which key, and how much.
    page.locator("#heatmap rect.cell[data-q='1'][data-k='2']").hover()
    tip = page.locator("#tooltip")
    tip.wait_for(state="visible")
    assert tokens[1] in tip.inner_text() and tokens[2] in tip.inner_text()
    assert f"{ref[1][2]:.4f}" in tip.inner_text()

    # The head's statistics, all heads of the layer, and per-token importance.
    assert page.locator("#head-stats td.num").count() == 6
    assert page.locator("#layer-stats tbody tr").count() == 4
    assert page.locator("#layer-stats tbody tr.selected").get_attribute("data-head") == "2"
    assert page.locator("#imp-cls .chip").count() == n
    assert page.locator("#imp-rollout .chip").count() == n
    page.mouse.move(0, 0)
    screenshot(page, "attention-view.png")

    # Small multiples: every head of layer 1, each a full n x n map, each clickable.
    page.get_by_role("button", name="All heads of this layer").click()
    multiples = page.locator("#multiples .multiple")
    multiples.first.wait_for()
    assert multiples.count() == 4
    for i in range(4):
        assert multiples.nth(i).locator("rect.cell").count() == n * n
    multiples.nth(3).click()
    assert page.locator("#head").input_value() == "3"
    assert "Layer 1 · head 3" in page.locator("#map-title").inner_text()
    assert page.locator("#multiples .multiple.selected").get_attribute("data-head") == "3"
    assert len(sent) == 1, "switching heads must not ask the server again"
    page.locator("#layer-card").scroll_into_view_if_needed()
    screenshot(page, "attention-heads.png")
    assert page.js_errors == []


def test_server_errors_are_shown_in_the_page(page, live: Live) -> None:
    enter_key(page)
    info = httpx.get(f"{live.url}/info", headers={"Authorization": f"Bearer {API_KEY}"}).json()
    limit = min(info["limits"]["attention_max_tokens"], info["max_length"])
    page.fill("#text", "word " * 3000)
    page.uncheck("#truncate")
    page.press("#text", "Control+Enter")
    wait_state(page, "error")
    error = page.locator("#error")
    assert error.is_visible()
    message = error.inner_text()
    assert "413" in message and "tokens" in message, message
    assert page.locator("#results").is_hidden()

    # Ticking "cut at the token limit" asks again and shows the first tokens.
    page.check("#truncate")
    wait_state(page, "ready")
    assert error.is_hidden()
    assert page.locator("#heatmap rect.cell").count() == limit * limit
    assert "cut" in page.locator("#status").inner_text()
    assert page.js_errors == []

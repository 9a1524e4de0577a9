"""The /attention/view page in a real headless Chromium, against a real `headwise serve` process
on the tiny bundle (2 layers, 4 heads), with an API key set so that the page's key input counts.

Needs Debian's chromium (`make system-deps`); playwright drives it, no browser is downloaded.
Screenshots go to artifacts/ under the repository root.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from itertools import pairwise
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
ARTIFACTS = Path(__file__).resolve().parents[3] / "artifacts"
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
    tokens = post(live, "/tokenize/details", {"inputs": TEXT})["results"][0]["tokens"]
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


def canvas_pixels(page, selector: str, cells: list[tuple[int, int]]) -> list[tuple[int, int, int]]:
    """The RGB of the backing-store pixel at the centre of each (query, key) cell of a canvas map."""
    return [
        tuple(rgb)
        for rgb in page.evaluate(
            """([selector, cells]) => {
                const cv = document.querySelector(selector), n = +cv.dataset.rows;
                const ctx = cv.getContext('2d');
                return cells.map(([q, k]) => {
                    const x = Math.floor(((k + 0.5) * cv.width) / n);
                    const y = Math.floor(((q + 0.5) * cv.height) / n);
                    return [...ctx.getImageData(x, y, 1, 1).data.slice(0, 3)];
                });
            }""",
            [selector, cells],
        )
    ]


def hover_canvas_cell(page, q: int, k: int, n: int) -> None:
    box = page.locator("#heatmap-canvas").bounding_box()
    assert box is not None
    page.mouse.move(
        box["x"] + (k + 0.5) * box["width"] / n, box["y"] + (q + 0.5) * box["height"] / n
    )


DARKEST = (
    0x08,
    0x30,
    0x6B,
)  # the top of the page's colour scale, given to each head's largest weight


def test_canvas_rendering(page, live: Live) -> None:
    """?render=canvas paints the maps on canvases (as the page does by itself for long inputs)."""
    tokens = post(live, "/tokenize/details", {"inputs": TEXT})["results"][0]["tokens"]
    n = len(tokens)
    page.goto(f"{live.url}/attention/view?render=canvas")
    enter_key(page)
    page.fill("#text", TEXT)
    page.select_option("#head", "1")
    page.get_by_role("button", name="Show").click()
    wait_state(page, "ready")

    # One canvas holds the cells, the SVG only the labels: every token on both axes.
    assert page.locator("#heatmap").get_attribute("data-render") == "canvas"
    canvas = page.locator("#heatmap canvas#heatmap-canvas")
    assert canvas.get_attribute("data-rows") == str(n)
    assert canvas.get_attribute("data-cols") == str(n)
    assert canvas.get_attribute("data-cells") == str(n * n)
    assert page.locator("#heatmap rect.cell").count() == 0
    assert page.locator("#heatmap text.xlabel").all_text_contents() == tokens
    assert page.locator("#heatmap text.ylabel").all_text_contents() == tokens

    # The colours follow the weights: the head's largest is the darkest blue, and over all cells
    # a larger weight is never lighter (the scale's RGB sum falls from white to dark blue).
    ref = post(live, "/attention", {"input": TEXT, "layers": [0], "heads": [1]})["attentions"][0][0]
    cells = [(q, k) for q in range(n) for k in range(n)]
    pixels = dict(zip(cells, canvas_pixels(page, "#heatmap-canvas", cells), strict=True))
    hi = max(cells, key=lambda c: ref[c[0]][c[1]])
    lo = min(cells, key=lambda c: ref[c[0]][c[1]])
    assert ref[hi[0]][hi[1]] > 2 * ref[lo[0]][lo[1]]
    assert pixels[hi] == DARKEST
    assert all(a < b for a, b in zip(pixels[hi], pixels[lo], strict=True)), (pixels[hi], pixels[lo])
    by_weight = sorted(cells, key=lambda c: ref[c[0]][c[1]])
    sums = [sum(pixels[c]) for c in by_weight]
    assert all(a >= b for a, b in pairwise(sums)), "a larger weight drawn lighter"

    # Hovering finds the cell from the mouse position: its tokens, weight, box and labels.
    tip = page.locator("#tooltip")
    for q, k in [(1, 2), (n - 1, 0), hi]:
        hover_canvas_cell(page, q, k, n)
        tip.wait_for(state="visible")
        text = tip.inner_text()
        assert tokens[q] in text and tokens[k] in text, text
        assert f"q{q} " in text and f"k{k}" in text and f"{ref[q][k]:.4f}" in text, text
        assert page.locator("#heatmap text.ylabel.hl").get_attribute("data-i") == str(q)
        assert page.locator("#heatmap text.xlabel.hl").get_attribute("data-i") == str(k)
        assert page.locator("#hover-box").get_attribute("visibility") == "visible"
    page.mouse.move(0, 0)
    tip.wait_for(state="hidden")

    # Small multiples: one canvas per head, each with every cell, each clickable.
    page.get_by_role("button", name="All heads of this layer").click()
    minis = page.locator("#multiples .multiple canvas.mini-canvas")
    minis.first.wait_for()
    assert minis.count() == 4
    assert page.locator("#multiples rect.cell").count() == 0
    for i in range(4):
        assert minis.nth(i).get_attribute("data-cells") == str(n * n)
    mini = "#multiples .multiple[data-head='1'] canvas"
    assert canvas_pixels(page, mini, [hi]) == [DARKEST]
    page.locator("#multiples .multiple[data-head='3'] canvas").click()
    assert page.locator("#head").input_value() == "3"
    assert "Layer 0 · head 3" in page.locator("#map-title").inner_text()
    assert page.locator("#multiples .multiple.selected").get_attribute("data-head") == "3"
    assert canvas.get_attribute("data-cells") == str(n * n)

    page.evaluate("window.scrollTo(0, 0)")
    page.wait_for_function("window.scrollY === 0")
    hover_canvas_cell(page, 1, 2, n)
    tip.wait_for(state="visible")
    screenshot(page, "attention-canvas.png")
    assert page.js_errors == []


# A synthetic /attention payload drawn through the page's window.headwise.render hook.
FAKE_PAYLOAD_JS = """
([n, heads]) => {
    let seed = 12345;
    const rand = () => ((seed = (seed * 1103515245 + 12345) % 2147483648) / 2147483648);
    const tokens = Array.from({ length: n }, (_, i) => (i === 0 ? "[CLS]" : i === n - 1 ? "[SEP]" : "tok" + i));
    const attentions = [Array.from({ length: heads }, (_, h) => Array.from({ length: n }, (_, q) => {
        const row = Array.from({ length: n }, (_, k) => rand() ** 4 + (k === (q + h) % n ? 3 : 0));
        const s = row.reduce((a, b) => a + b, 0);
        return row.map((v) => v / s);
    }))];
    const stats = Array.from({ length: heads }, (_, h) => ({
        layer: 0, head: h, entropy: 1 + h / 10, max_weight: 0.5, cls_mass: 0.1,
        sep_mass: 0.1, mean_distance: h, diagonal_mass: 0.2,
    }));
    const imp = Array.from({ length: n }, () => rand());
    return {
        tokens, layers: [0], heads: Array.from({ length: heads }, (_, h) => h), attentions, stats,
        importance: { cls_last_layer: imp, rollout: imp }, truncated: false,
    };
}
"""

TIME_RENDER_JS = """
async (fn) => {
    const painted = () => new Promise((r) => requestAnimationFrame(() => setTimeout(r, 0)));
    const t0 = performance.now();
    fn === "map" ? window.headwise.render(window.fake) : document.getElementById("all-heads").click();
    const t1 = performance.now();
    await painted();
    return [t1 - t0, performance.now() - t0];
}
"""


def test_long_inputs_are_painted_on_canvases(page, live: Live) -> None:
    """At 256 tokens the page picks canvases by itself; the SVG alternative is timed for comparison."""
    n, heads = 256, 12
    page.evaluate(f"window.fake = ({FAKE_PAYLOAD_JS})([{n}, {heads}])")
    timings = {}
    timings["canvas map"] = page.evaluate(TIME_RENDER_JS, "map")
    assert page.locator("#heatmap").get_attribute("data-render") == "canvas"
    assert page.locator("#heatmap-canvas").get_attribute("data-cells") == str(n * n)
    assert page.locator("#heatmap rect.cell").count() == 0
    labels = page.locator("#heatmap text.xlabel").count()
    assert 8 <= labels < n, "labels are thinned out on a dense map"
    timings["canvas small maps"] = page.evaluate(TIME_RENDER_JS, "heads")
    minis = page.locator("#multiples canvas.mini-canvas")
    assert minis.count() == heads
    assert {minis.nth(i).get_attribute("data-cells") for i in range(heads)} == {str(n * n)}
    assert page.js_errors == []

    page.goto(f"{live.url}/attention/view?render=svg")
    page.evaluate(f"window.fake = ({FAKE_PAYLOAD_JS})([{n}, {heads}])")
    timings["svg map"] = page.evaluate(TIME_RENDER_JS, "map")
    assert page.locator("#heatmap").get_attribute("data-render") == "svg"
    assert page.locator("#heatmap rect.cell").count() == n * n
    for name, (run_ms, painted_ms) in timings.items():
        print(f"{name} {n}x{n}: {run_ms:.0f} ms to run, {painted_ms:.0f} ms to the next frame")


@pytest.fixture(scope="module")
def live_two(browser, tiny_bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    """Two models with attention maps, so the page offers a choice."""
    tmp = tmp_path_factory.mktemp("viewer-two")
    with serve([f"first={tiny_bundle}", f"second={tiny_bundle}"], tmp, ready_s=60) as server:
        yield server


def test_a_pair_is_split_where_the_document_starts_and_the_model_can_be_chosen(
    browser, live_two: Live
) -> None:
    context = browser.new_context(viewport={"width": 1360, "height": 900})
    context.set_default_timeout(WAIT_MS)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    requests: list[dict] = []
    page.on(
        "request",
        lambda r: requests.append(json.loads(r.post_data))
        if r.url.endswith("/attention") and r.post_data
        else None,
    )
    try:
        page.goto(f"{live_two.url}/attention/view")
        page.wait_for_function("document.querySelectorAll('#modelsel option').length === 2")
        assert page.locator("#modelsel").is_visible()
        page.select_option("#modelsel", "second")
        page.fill("#text", "the cat")
        page.fill("#pair", "the dog sat")
        page.click("#show")
        wait_state(page, "ready")
        assert requests[-1]["model"] == "second" and requests[-1]["pair"] == "the dog sat"
        body = httpx.post(
            f"{live_two.url}/attention",
            json={"input": "the cat", "pair": "the dog sat", "model": "second", "layers": [0]},
        ).json()
        boundary = body["boundary"]
        assert body["tokens"][boundary] == "the" and body["tokens"][boundary - 1] == "[SEP]"
        assert page.locator("#boundary-x").count() == 1 and page.locator("#boundary-y").count() == 1
        docs = page.locator("#heatmap-svg text.ylabel.doc").all_text_contents()
        assert docs == ["the", "dog", "sat"]  # the document's tokens, marked apart
        screenshot(page, "attention-pair.png")
        assert not errors, errors
    finally:
        context.close()


@pytest.fixture(scope="module")
def live_explain(
    browser, tiny_bundle: Path, ranker_bundle: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Live]:
    """An embedder and a reranker: a pair's explanation, and two texts' similarity."""
    tmp = tmp_path_factory.mktemp("viewer-explain")
    with serve([str(tiny_bundle), f"ranker={ranker_bundle}"], tmp, ready_s=60) as server:
        yield server


DARKEST_RED = (0x67, 0x00, 0x0D)  # the other end of the occlusion scale: the output is closer without it


def rgb(css: str) -> tuple[int, int, int]:
    r, g, b = (int(x) for x in css[css.index("(") + 1 : css.index(")")].split(",")[:3])
    return r, g, b


def shown_parts(page, text: int, kind: str) -> list[dict]:
    """Each shaded part of one row: its words, value and background colour as drawn."""
    return page.evaluate(
        """([text, kind]) => [...document.querySelectorAll(
            `#explain .xtext[data-text='${text}'] .xrow[data-kind='${kind}'] .part`)].map((s) => ({
                text: s.textContent, value: s.dataset.value === "" ? null : +s.dataset.value,
                bg: getComputedStyle(s).backgroundColor, title: s.title }))""",
        [text, kind],
    )


def test_a_pairs_words_are_shaded_by_occlusion_and_by_attention_side_by_side(
    browser, live_explain: Live
) -> None:
    from io import BytesIO

    from PIL import Image

    context = browser.new_context(viewport={"width": 1360, "height": 900}, accept_downloads=True)
    context.set_default_timeout(WAIT_MS)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    sent: list[dict] = []
    page.on(
        "request",
        lambda r: sent.append(json.loads(r.post_data)) if r.url.endswith("/explain") else None,
    )
    query, doc = "where does the cat sleep?", "the cat sleeps on a warm mat, purring."
    try:
        page.goto(f"{live_explain.url}/attention/view")
        page.wait_for_function("document.querySelectorAll('#modelsel option').length === 2")
        page.select_option("#modelsel", "ranker")
        page.fill("#text", query)
        page.fill("#pair", doc)
        page.click("#show")
        wait_state(page, "ready")
        page.wait_for_selector("#explain-card[data-state='ready']")
        body = {"model": "ranker", "granularity": "word", "truncate": True, "pair": [query, doc]}
        assert sent == [body]  # a reranker explains the pair, a word at a time by default
        want = httpx.post(f"{live_explain.url}/explain", json=body, timeout=30).json()

        # Each text twice: every word shaded by its occlusion importance, and by its attention.
        everything = {"occlusion": [], "attention": []}
        for t, parts in enumerate(want["parts"]):
            for kind, key in (("occlusion", "importance"), ("attention", "attention")):
                shown = shown_parts(page, t, kind)
                assert [s["text"] for s in shown] == [p["text"] for p in parts]
                for s, p in zip(shown, parts, strict=True):
                    assert s["value"] == pytest.approx(p[key], abs=1e-9)
                    assert f"{p['importance']:.4f}" in s["title"] and f"{p['attention']:.4f}" in s["title"]
                    everything[kind].append((p[key], rgb(s["bg"])))
            lines = page.locator(f"#explain .xtext[data-text='{t}'] .xrow .line").all_inner_texts()
            assert lines == [(query, doc)[t]] * 2  # the text as written, spaces and all
            rho = page.locator(f"#explain .xtext[data-text='{t}'] .rho")
            assert float(rho.get_attribute("data-rho")) == pytest.approx(want["spearman"][t])
            assert f"ρ {want['spearman'][t]:.3f}" in rho.inner_text()
        assert f"relevance {want['score']:.4f}" in page.locator("#explain-summary").inner_text()

        # The shading follows the values: the largest attention is the darkest blue and a larger
        # one is never lighter; occlusion is blue where the output needed the word, red where it
        # is closer without it, the largest magnitude at the darkest end of its side.
        by_attention = sorted(everything["attention"], key=lambda x: x[0])
        assert by_attention[-1][1] == DARKEST
        sums = [sum(c) for _, c in by_attention]
        assert all(a >= b for a, b in pairwise(sums)), "a larger attention drawn lighter"
        value, extreme = max(everything["occlusion"], key=lambda x: abs(x[0]))
        assert extreme == (DARKEST if value > 0 else DARKEST_RED)
        for value, (r, _, b) in everything["occlusion"]:
            assert (b >= r) if value >= 0 else (r > b), (value, r, b)
        assert any(v < 0 for v, _ in everything["occlusion"]) and any(
            v > 0 for v, _ in everything["occlusion"]
        )
        page.locator("#explain-card").scroll_into_view_if_needed()
        screenshot(page, "explain-pair.png")

        # The view as a PNG: both shadings drawn, the darkest blue among them.
        with page.expect_download() as download:
            page.click("#export-png")
        assert download.value.suggested_filename == "headwise-explanation.png"
        png = Image.open(BytesIO(Path(download.value.path()).read_bytes())).convert("RGB")
        assert png.width == 1920 and png.height > 300
        colours = {c for _, c in png.getcolors(1 << 20)}
        assert DARKEST in colours and extreme in colours

        # Tokens instead of words: asked again, a part per token.
        page.select_option("#granularity", "token")
        tokens = httpx.post(
            f"{live_explain.url}/explain", json={**body, "granularity": "token"}, timeout=30
        ).json()
        page.wait_for_function(
            f"document.querySelectorAll('#explain .xrow .part').length === "
            f"{2 * sum(len(p) for p in tokens['parts'])}"
        )
        assert sent[-1]["granularity"] == "token"

        # An embedder with two texts explains their similarity.
        page.select_option("#modelsel", "tiny-random")
        wait_state(page, "ready")
        page.wait_for_function(
            "document.querySelector('#explain-card').dataset.state === 'ready'"
            " && document.querySelector('#explain-summary').textContent.startsWith('cosine')"
        )
        assert sent[-1] == {
            "model": "tiny-random", "granularity": "token", "truncate": True,
            "similarity": [query, doc],
        }  # fmt: skip
        assert page.locator("#explain .xtext").count() == 2
        assert not errors, errors
    finally:
        context.close()


def test_the_head_grid_sizes_each_head_by_its_importance_and_opens_its_map(
    browser, live_explain: Live
) -> None:
    context = browser.new_context(viewport={"width": 1360, "height": 900})
    context.set_default_timeout(WAIT_MS)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    text = "the cat sat on the warm mat"
    try:
        page.goto(f"{live_explain.url}/attention/view")
        page.wait_for_function("document.querySelectorAll('#modelsel option').length === 2")
        page.select_option("#modelsel", "tiny-random")
        page.fill("#text", text)
        page.click("#show")
        wait_state(page, "ready")
        page.wait_for_selector("#explain-card[data-state='ready']")
        page.select_option("#granularity", "head")
        page.wait_for_selector("#explain .hgrid")
        want = httpx.post(
            f"{live_explain.url}/explain",
            json={"input": text, "granularity": "head", "model": "tiny-random"},
            timeout=30,
        ).json()["heads"]
        cells = page.evaluate(
            """() => [...document.querySelectorAll('#explain .hcell')].map((c) => ({
                layer: +c.dataset.layer, head: +c.dataset.head, value: +c.dataset.importance,
                side: c.querySelector('i').getBoundingClientRect().width }))"""
        )
        assert [(c["layer"], c["head"]) for c in cells] == [(h["layer"], h["head"]) for h in want]
        for c, h in zip(cells, want, strict=True):
            assert abs(c["value"] - h["importance"]) < 1e-6
        top = max(cells, key=lambda c: abs(c["value"]))
        low = min(cells, key=lambda c: abs(c["value"]))
        assert top["side"] == 24 and top["side"] > low["side"]  # sized by importance
        assert "heads left out one at a time" in page.locator("#explain-summary").inner_text()
        page.locator("#explain-card").scroll_into_view_if_needed()
        screenshot(page, "explain-heads.png")
        page.click(f"#explain .hcell[data-layer='{top['layer']}'][data-head='{top['head']}']")
        page.wait_for_function(
            f"document.querySelector('#map-title').textContent.includes('Layer {top['layer']}')"
            f" && document.querySelector('#map-title').textContent.includes('head {top['head']}')"
        )
        assert page.locator("#head").input_value() == str(top["head"])
        assert not errors, errors
    finally:
        context.close()


# The manual's picture of the viewer (README, docs/attention.md) is this test's screenshot: the
# default model, one sentence, layer 2, every head. HEADWISE_DOCS_SCREENSHOTS=1 (make
# docs-screenshots) writes it; otherwise the test checks the committed one is the shape it makes.
MANUAL_SCREENSHOT = Path(__file__).resolve().parents[3] / "docs" / "assets" / "viewer.png"


def test_the_manuals_screenshot_is_the_viewer_on_the_default_model(browser, default_bundle, tmp_path):
    import os
    import struct

    with serve(default_bundle, tmp_path, ready_s=120) as server:
        context = browser.new_context(viewport={"width": 1360, "height": 900})
        context.set_default_timeout(WAIT_MS)
        page = context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        try:
            page.goto(f"{server.url}/attention/view")
            page.wait_for_function("document.querySelectorAll('#layer option').length === 6")
            page.fill("#text", "The cat sat on the mat because it was warm.")
            page.select_option("#layer", "2")
            page.get_by_role("button", name="Show").click()
            wait_state(page, "ready")
            shot = tmp_path / "viewer.png"
            page.screenshot(path=str(shot), full_page=False)
        finally:
            context.close()
    assert not errors, errors

    def size(png: Path) -> tuple[int, int]:
        head = png.read_bytes()[:24]
        assert head[:8] == b"\x89PNG\r\n\x1a\n"
        return struct.unpack(">II", head[16:24])

    if os.environ.get("HEADWISE_DOCS_SCREENSHOTS") == "1":
        MANUAL_SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
        MANUAL_SCREENSHOT.write_bytes(shot.read_bytes())
    assert MANUAL_SCREENSHOT.exists(), "make docs-screenshots writes it"
    assert size(MANUAL_SCREENSHOT) == size(shot) == (1360, 900)


def test_an_images_patches_are_shaded_over_the_picture(browser, tmp_path_factory) -> None:
    """A CLIP bundle: the viewer takes a picture, lays the class token's attention (per head),
    rollout and occlusion over its patches, and a click on a patch shows where that patch looks."""
    from export.cli import main
    from tests.models.image_checkpoints import save_clip
    from tests.service.api.test_images import PICTURES, encoded

    tmp = tmp_path_factory.mktemp("viewer-image")
    save_clip(tmp / "clip")
    assert main(["--model", str(tmp / "clip"), "--out", str(tmp / "bundle")]) == 0
    picture = tmp / "picture.png"
    picture.write_bytes(encoded(PICTURES[0]))
    with serve(tmp / "bundle", tmp, ready_s=60) as server:
        context = browser.new_context(viewport={"width": 1360, "height": 900})
        context.set_default_timeout(WAIT_MS)
        page = context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        try:
            page.goto(f"{server.url}/attention/view")
            page.wait_for_function("document.querySelectorAll('#modelsel option').length === 1")
            page.set_input_files("#image", str(picture))
            wait_state(page, "ready")
            page.wait_for_selector("#picture-card[data-drawn='head']")
            assert "from [CLS]" in page.locator("#picture-title").inner_text()
            assert page.locator("#clear-image").is_visible()
            # The picture is drawn, its patches shaded: many colours on the canvas.
            colours = page.evaluate(
                """() => { const cv = document.querySelector('#picture-canvas');
                  const px = cv.getContext('2d').getImageData(0, 0, cv.width, cv.height).data;
                  const seen = new Set(); for (let i = 0; i < px.length; i += 4 * 37) seen.add(px[i] + ',' + px[i+1] + ',' + px[i+2]);
                  return seen.size; }"""
            )
            assert colours > 20, colours
            # The heat map's tokens are the patches, [CLS] first.
            assert page.locator("#heatmap text.xlabel[data-i='1']").first.text_content() == "r0c0"
            box = page.locator("#picture-canvas").bounding_box()
            at = {"x": box["width"] * 0.6, "y": box["height"] * 0.3}  # row 1, column 2 of 4 x 4
            page.locator("#picture-canvas").click(position=at)
            page.wait_for_function("document.querySelector('#picture-title').textContent.includes('patch r1c2')")
            page.wait_for_selector("#explain-card[data-state='ready']")
            assert "16 patches" in page.locator("#explain-summary").inner_text()
            page.select_option("#overlay", "occlusion")
            page.wait_for_selector("#picture-card[data-drawn='occlusion']")
            page.select_option("#overlay", "rollout")
            page.wait_for_selector("#picture-card[data-drawn='rollout']")
            page.locator("#picture-card").scroll_into_view_if_needed()
            screenshot(page, "attention-image.png")
            assert not errors, errors
        finally:
            context.close()

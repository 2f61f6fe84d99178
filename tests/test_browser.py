"""The book as a reader meets it: every page of _toc.yml opened in headless Chromium.

Builds the book (strict) if needed, serves _build/html on 127.0.0.1 and checks each page: no console
errors, its chapter title, its code outputs, its figures decoded, its math rendered. Search for a Chinese
word from chapter 5 must find chapter 5. A full-page screenshot of each page is kept in
_build/screenshots/ to look at. No glued value on a built page reads as a Python repr (True, None, nan).

Needs Debian's chromium (/usr/bin/chromium; `.ci/run` installs it). Without it the tests that build the
book skip, except in CI (CI=true), where a missing browser is a failure.
"""
import functools
import html
import http.server
import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from bookbuild import book

REPO = Path(__file__).resolve().parent.parent
HTML = REPO / "_build" / "html"
SHOTS = REPO / "_build" / "screenshots"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
SEARCH_WORD, SEARCH_PAGE = "递减", "chapters/05_scaling"  # 收益递减: diminishing returns

if not CHROMIUM and os.environ.get("CI") == "true":
    raise RuntimeError("CI needs Debian's chromium for the browser tests: apt-get install chromium")
NO_CHROMIUM = "no chromium on this machine (apt-get install chromium)"


def toc_pages():
    return [book.docname(md) for md in book.pages()]


def page_title(docname):
    for line in (REPO / f"{docname}.md").read_text(encoding="utf-8").splitlines():
        if line.startswith("# "):
            return line[2:].strip()
    raise AssertionError(f"{docname}.md has no title")


@pytest.fixture(scope="module")
def site():
    if not CHROMIUM:  # the book is built only where its pages can be opened
        pytest.skip(NO_CHROMIUM)
    build = subprocess.run([sys.executable, "-m", "bookbuild.build", "--strict"], cwd=REPO)
    assert build.returncode == 0, "the strict book build failed"
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(HTML))
    handler.log_message = lambda *a: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.fixture(scope="module")
def browser():
    if not CHROMIUM:
        pytest.skip(NO_CHROMIUM)
    playwright = pytest.importorskip("playwright.sync_api")
    with playwright.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync"])
        yield b
        b.close()


def open_page(browser, url):
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    errors = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(url, wait_until="networkidle")
    return page, errors


@pytest.mark.parametrize("docname", toc_pages())
def test_page_renders(site, browser, docname):
    source = (REPO / f"{docname}.md").read_text(encoding="utf-8")
    page, errors = open_page(browser, f"{site}/{docname}.html")
    try:
        if "$" in source:  # MathJax typesets after load
            page.wait_for_selector("mjx-container", timeout=20_000)
        assert page.locator("h1").first.inner_text().strip().rstrip("#").strip() == page_title(docname)
        n_code = source.count("```{code-cell}")
        outputs = page.locator(".cell_output").count()
        if n_code:
            assert outputs > 0, "a notebook page shows no code outputs"
        images = page.eval_on_selector_all(
            "main img", "imgs => imgs.map(i => [i.complete, i.naturalWidth, i.naturalHeight, i.src])")
        assert all(ok and w > 0 and h > 0 for ok, w, h, _ in images), f"undecoded images: {images}"
        if "plt.show()" in source:
            assert images, "a page that draws a figure shows no image"
        if "$" in source:
            assert page.locator("mjx-container").count() > 0, "math is not rendered"
            assert "\\frac" not in page.locator("main").inner_text()
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOTS / f"{Path(docname).name}.png"), full_page=True)
        assert not errors, f"console errors: {errors}"
    finally:
        page.close()


def test_chinese_search_finds_the_scaling_chapter(site, browser):
    if SEARCH_PAGE not in toc_pages():
        pytest.fail(f"{SEARCH_PAGE} is not in _toc.yml")
    page, errors = open_page(browser, f"{site}/search.html?q={SEARCH_WORD}")
    try:
        page.wait_for_selector("#search-results ul.search li", timeout=30_000)
        links = page.eval_on_selector_all("#search-results ul.search li a", "as => as.map(a => a.href)")
        assert any(re.search(re.escape(SEARCH_PAGE) + r"\.html", href) for href in links), links
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOTS / "search.png"))
        assert not errors, f"console errors: {errors}"
    finally:
        page.close()


# ---- glued values read as prose ----
# myst-nb renders {glue:text}`key` as <span class="pasted-text">value</span>. A value glued as a bool, None
# or a numpy scalar shows up as its Python repr, which no sentence means.

PASTED = re.compile(r'<span class="(?:[^"]*\s)?pasted-text(?:\s[^"]*)?">(.*?)</span>', re.S)
REPR = re.compile(r"(True|False|None|nan|NaN|-?inf|(np|numpy|torch)\.\w+\(.*\)|tensor\(.*\))")


def repr_glues(page_html):
    """The glued texts on a built page that are a Python repr rather than prose."""
    texts = (html.unescape(re.sub(r"<[^>]+>", "", m)).strip() for m in PASTED.findall(page_html))
    return [t for t in texts if REPR.fullmatch(t)]


def test_repr_glues_finds_a_glued_bool():
    page = ('<p>最快的是 <span class="pasted-text">bf16 compile</span>，断言 <span class="pasted-text">True</span>，'
            '<span class="pasted-text">np.float64(0.5)</span>，<span class="pasted-text">nan</span>。</p>')
    assert repr_glues(page) == ["True", "np.float64(0.5)", "nan"]
    assert repr_glues('<span class="pasted-text">1,803,392</span> <span class="pasted-text">快了 1.50 倍</span>') == []


def test_no_glued_value_reads_as_a_repr(site):
    found = {}
    for docname in toc_pages():
        bad = repr_glues((HTML / f"{docname}.html").read_text(encoding="utf-8"))
        if bad:
            found[docname] = bad
    assert not found, f"glued values that read as a Python repr, not prose (glue a string instead): {found}"

"""The book as a reader meets it: every page of _toc.yml opened in headless Chromium.

Takes the session's strict build of the book (tests/conftest.py), served on 127.0.0.1, and checks each
page: no console errors, its chapter title, its code outputs, its figures decoded, its math rendered. Search for a Chinese
word from chapter 9 must find chapter 9. With BOOK_SCREENSHOTS=1 a full-page screenshot of each page is
kept in _build/screenshots/ to look at (about a second a page, so not by default). No glued value on a
built page reads as a Python repr (True, None, nan).
Every image in a page's cell outputs carries alt text, and in the theme's dark mode every figure is
opaque and shown on a light background (screenshots in _build/screenshots/dark-*.png). The provenance page has a
row for every chapter, each executed.

Needs Debian's chromium (/usr/bin/chromium; `.ci/run` installs it). Without it the tests that build the
book skip, except in CI (CI=true), where a missing browser is a failure.
"""
import html
import os
import re
from pathlib import Path

import pytest
from conftest import goto_ready

from bookbuild import book, provenance

REPO = Path(__file__).resolve().parent.parent
HTML = REPO / "_build" / "html"
SHOTS = REPO / "_build" / "screenshots"
FULL_PAGE_SHOTS = os.environ.get("BOOK_SCREENSHOTS") == "1"
SEARCH_WORD, SEARCH_PAGE = "递减", "chapters/09_3_chinchilla"  # 收益递减: diminishing returns


def toc_pages():
    return [book.docname(md) for md in book.pages()]


def page_title(docname):
    return book.title(REPO / f"{docname}.md")


# The fixtures `site` (the session's strict build, served on 127.0.0.1) and `browser` (one headless
# Chromium) are tests/conftest.py's, shared with the other tests of the built book.


# An image's alt text says what it shows. Without the cell option mystnb: image: alt:, myst-nb writes the
# image's own path (../_images/<hash>.png) as its alt: that counts as none.
NO_ALT_JS = "!(i.getAttribute('alt') || '').trim() || /_images\\/|\\.(png|jpe?g|svg|gif)$/i.test(i.getAttribute('alt').trim())"


def open_page(browser, url):
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    errors = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    goto_ready(page, url)
    return page, errors


@pytest.mark.parametrize("docname", toc_pages())
def test_page_renders(site, browser, docname):
    source = (REPO / f"{docname}.md").read_text(encoding="utf-8")
    page, errors = open_page(browser, f"{site}/{docname}.html")
    try:
        if "$" in source:  # MathJax typesets after load
            page.wait_for_selector("mjx-container >> visible=true", timeout=20_000)
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
        no_alt = page.eval_on_selector_all(".cell_output img", f"imgs => imgs.filter(i => {NO_ALT_JS}).map(i => i.alt)")
        assert not no_alt, (f"output image(s) without alt text {no_alt}: give the cell that draws each one the "
                            "option mystnb: image: alt: (see any figure cell of chapter 11)")
        if "$" in source:
            assert page.locator("mjx-container").count() > 0, "math is not rendered"
            assert "\\frac" not in page.locator("main").inner_text()
        if FULL_PAGE_SHOTS:
            SHOTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(SHOTS / f"{Path(docname).name}.png"), full_page=True)
        assert not errors, f"console errors: {errors}"
    finally:
        page.close()


def test_the_alt_rule_rejects_a_missing_alt_and_a_path(browser):
    page = browser.new_page()
    try:
        page.set_content('<div class="cell_output"><img alt="../_images/3f2a.png"><img alt=" "><img>'
                         '<img alt="折线图：验证损失随步数下降"></div>')
        flagged = page.eval_on_selector_all(".cell_output img", f"imgs => imgs.filter(i => {NO_ALT_JS}).length")
        assert flagged == 3
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


TEX_WORD = "全局批次"  # an excerpt of 05_accumulation holds $$B_\text{global} = …$$
RAW_TEX = re.compile(r"\\[(\[)]|\\[A-Za-z]+|\$\$")


def test_search_excerpts_read_math_as_text(site, browser):
    """An excerpt is cut from the page's text, where MathJax's source sits between \\( \\) or \\[ \\]:
    bookbuild/search.py's bookPlainMath writes it as the symbols it prints."""
    page, errors = open_page(browser, f"{site}/search.html?q={TEX_WORD}")
    try:
        assert page.evaluate(r"""() => bookPlainMath(
            "设 \\(T^*\\) 步；\\[B_\\text{global} = \\frac{G-1}{G}\\,b \\times k \\approx 37\\%\\]")""") \
            == "设 T^* 步；B_global = (G-1)/G b × k ≈ 37%"
        page.wait_for_function("() => document.querySelectorAll('#search-results ul.search li').length > 3 && "
                               "[...document.querySelectorAll('#search-results ul.search li')]"
                               ".every(li => li.querySelector('p.context'))", timeout=30_000)
        excerpts = page.eval_on_selector_all("#search-results p.context", "ps => ps.map(p => p.textContent)")
        assert any("B_global = " in e for e in excerpts), excerpts  # \[B_\text{global} = …\], as text
        raw = [e for e in excerpts if RAW_TEX.search(e)]
        assert not raw, f"excerpts with TeX: {raw}"
        assert not errors, f"console errors: {errors}"
    finally:
        page.close()


# ---- figures in the theme's dark mode ----
# A figure must stay readable when the reader switches the theme to dark. Two things make it so, and
# both are checked: matplotlib draws each figure on an opaque white background (no transparent PNG that
# would put black axis labels on the dark page), and the theme (pydata-sphinx-theme) shows every cell
# output image on a light card in dark mode. The check decodes each figure's own pixels, and looks at
# the rendered pixels along each figure's edges, where the dark page would show if either went away.

LIGHT = 150  # luminance 0-255 of a figure's rendered edge in dark mode; the dark page is about 18
PNG_CORNERS_JS = """i => { const c = document.createElement('canvas'); c.width = i.naturalWidth; c.height = i.naturalHeight;
  const x = c.getContext('2d'); x.drawImage(i, 0, 0); const w = c.width - 1, h = c.height - 1;
  return [[0, 0], [w, 0], [0, h], [w, h]].map(([a, b]) => Array.from(x.getImageData(a, b, 1, 1).data)); }"""


def luminance(rgb):
    r, g, b = rgb[:3]
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def edge_pixels(png_bytes):
    """The pixels halfway along each edge of an element's screenshot, 3 px inside."""
    import io

    from PIL import Image
    im = Image.open(io.BytesIO(png_bytes)).convert("RGB")
    w, h = im.size
    return [im.getpixel(xy) for xy in ((3, h // 2), (w - 4, h // 2), (w // 2, 3), (w // 2, h - 4))]


def test_edge_pixels_tell_a_light_figure_from_a_transparent_one():
    import io

    from PIL import Image

    def png(color):
        buf = io.BytesIO()
        Image.new("RGB", (40, 30), color).save(buf, format="PNG")
        return buf.getvalue()
    assert all(luminance(p) > LIGHT for p in edge_pixels(png((255, 255, 255))))
    assert not any(luminance(p) > LIGHT for p in edge_pixels(png((18, 18, 18))))  # the dark page through it


def test_png_corners_see_a_transparent_figure(browser):
    import base64
    import io

    from PIL import Image
    buf = io.BytesIO()
    Image.new("RGBA", (20, 10), (255, 255, 255, 0)).save(buf, format="PNG")
    page = browser.new_page()
    try:
        page.set_content(f'<img src="data:image/png;base64,{base64.b64encode(buf.getvalue()).decode()}">')
        page.wait_for_function("document.images[0].complete")
        corners = page.locator("img").evaluate(PNG_CORNERS_JS)
        assert [a for *_, a in corners] == [0, 0, 0, 0]
    finally:
        page.close()


def figure_pages():
    return [d for d in toc_pages() if "plt.show()" in (REPO / f"{d}.md").read_text(encoding="utf-8")]


@pytest.mark.parametrize("docname", figure_pages())
def test_figures_are_light_in_dark_mode(site, browser, docname):
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.add_init_script("localStorage.setItem('mode', 'dark'); localStorage.setItem('theme', 'dark');")
    page = context.new_page()
    try:
        goto_ready(page, f"{site}/{docname}.html")
        assert page.evaluate("document.documentElement.dataset.theme") == "dark"
        body = page.evaluate("getComputedStyle(document.body).backgroundColor")
        assert luminance([int(v) for v in re.findall(r"\d+", body)]) < 80, f"the page is not dark: {body}"
        figures = page.locator(".cell_output img")
        assert figures.count() > 0
        SHOTS.mkdir(parents=True, exist_ok=True)
        dark = []
        for i in range(figures.count()):
            fig = figures.nth(i)
            corners = fig.evaluate(PNG_CORNERS_JS)
            assert all(a == 255 and luminance(rgb) > 240 for *rgb, a in corners), (
                f"figure {i + 1} is not drawn on an opaque white background: corner pixels (RGBA) {corners}")
            fig.scroll_into_view_if_needed()
            shot = fig.screenshot(path=str(SHOTS / f"dark-{Path(docname).name}-{i + 1}.png"))
            dark += [(i + 1, p) for p in edge_pixels(shot) if luminance(p) < LIGHT]
        assert not dark, f"figures with a dark edge in dark mode (figure number, pixel): {dark}"
    finally:
        context.close()


# ---- the provenance page ----

def test_provenance_page_has_a_row_per_chapter(site):
    page = (HTML / "chapters" / "provenance.html").read_text(encoding="utf-8")
    rows = [html.unescape(re.sub(r"<[^>]+>", " ", r)) for r in re.findall(r"<tr[^>]*>(.*?)</tr>", page, re.S)]
    for md in book.chapters():
        row = next((r for r in rows if page_title(book.docname(md)) in r), None)
        assert row is not None, f"the provenance page has no row for {md.name}"
        assert all(provenance.HOW[h] not in row for h in ("not executed", "failed")), f"{md.name}: {' '.join(row.split())}"
        assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d UTC", row), f"{md.name}: no execution time in {row!r}"


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

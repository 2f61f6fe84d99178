"""The pages fit and read as Chinese: every page of _toc.yml in headless Chromium at 1280 and 390 px.

- Code cells and their outputs wrap at 1280 px: none scrolls sideways (_static/book.css).
- No page scrolls sideways at 390 px (long inline code breaks; figures and wide math scroll in their
  own boxes).
- Figure text is legible at both widths: each figure is shown at no less than LEGIBLE of its drawn
  size (the figures are drawn at 100 dpi, their text at 7-10 pt, so 10 pt reads at about 9.7 px).
- Figures are numbered per chapter: 图 N.1, 图 N.2, ... (bookbuild/pages.py).
- Quotation marks and dashes: no ”…” (two closing quotes), no en dash the source does not have (so a
  glued "+--+" stays four signs).
- Glued text carries no Markdown (a backtick or a $ shows literally in a {glue:text} value).
- The UI strings are Chinese: the hidden cells' prompts and the search box.
- Each chapter says on its first screen, right after its first paragraph, how long it took to execute and
  on which CPU, linking to the provenance page (bookbuild/provenance.py).

Uses the site and browser fixtures of tests/test_browser.py (a strict build of the book, served on
127.0.0.1). The unit tests at the end need neither.
"""
import json
import re

import pytest
from test_browser import REPO, browser, site, toc_pages  # noqa: F401  (browser, site: the fixtures)

from bookbuild import book, pages

WIDTHS = (1280, 390)
LEGIBLE = 0.65  # shown width / drawn width of a figure: 10 pt at 100 dpi reads at 9 px or more

MEASURE_JS = """() => {
  const main = document.querySelector('main');
  const wide = (sel) => [...main.querySelectorAll(sel)].filter(e => e.scrollWidth > e.clientWidth + 1)
    .map(e => e.textContent.trim().slice(0, 60));
  return {
    page: document.documentElement.scrollWidth, viewport: window.innerWidth,
    code: wide('div.cell_input pre'), outputs: wide('div.cell_output pre'),
    figures: [...main.querySelectorAll('div.cell_output img')]
      .map(i => [i.naturalWidth, i.getBoundingClientRect().width]),
    captions: [...main.querySelectorAll('.caption-number')].map(e => e.textContent.trim()),
    text: main.innerText,
    glued: [...main.querySelectorAll('.pasted-text')].map(e => e.textContent),
    prompts: [...main.querySelectorAll('details.hide summary p')].map(e => e.textContent.trim()),
    search_box: [...document.querySelectorAll('input[name="q"]')].map(e => e.placeholder),
    runtime: [...main.querySelectorAll('p.chapter-runtime')].map(e => ({
      text: e.textContent, after: e.previousElementSibling?.tagName,
      first_p: e === main.querySelector('section > p:not(.chapter-runtime)')?.nextElementSibling,
      href: e.querySelector('a')?.getAttribute('href') ?? null})),
  };
}"""


@pytest.fixture(scope="module")
def measured(site, browser):  # noqa: F811
    """What MEASURE_JS finds on every page at each width: {(docname, width): {...}}."""
    found = {}
    for width in WIDTHS:
        context = browser.new_context(viewport={"width": width, "height": 900})
        for docname in toc_pages():
            page = context.new_page()
            page.goto(f"{site}/{docname}.html", wait_until="networkidle")
            if "$" in (REPO / f"{docname}.md").read_text(encoding="utf-8"):
                # typeset math has its final width
                page.wait_for_selector("mjx-container >> visible=true", timeout=20_000)
            found[docname, width] = page.evaluate(MEASURE_JS)
            page.close()
        context.close()
    return found


@pytest.mark.parametrize("width", WIDTHS)
def test_no_page_scrolls_sideways(measured, width):
    wide = {d: m["page"] for (d, w), m in measured.items() if w == width and m["page"] > m["viewport"]}
    assert not wide, f"pages wider than the {width} px window (page width): {wide}"


def test_code_and_outputs_fit_at_1280(measured):
    cut = {d: m["code"] + m["outputs"] for (d, w), m in measured.items() if w == 1280 and (m["code"] or m["outputs"])}
    assert not cut, f"code cells or outputs that scroll sideways at 1280 px: {json.dumps(cut, ensure_ascii=False)}"


@pytest.mark.parametrize("width", WIDTHS)
def test_figure_text_is_legible(measured, width):
    small = {d: [f"{shown:.0f} of {drawn} px" for drawn, shown in m["figures"] if drawn and shown / drawn < LEGIBLE]
             for (d, w), m in measured.items() if w == width}
    small = {d: s for d, s in small.items() if s}
    assert not small, f"figures shown below {LEGIBLE:.0%} of their drawn size at {width} px: {small}"


def test_figures_are_numbered_by_chapter(measured):
    for md in book.chapters():
        n = book.chapter_number(md)
        captions = measured[book.docname(md), 1280]["captions"]
        assert captions == [f"图 {n}.{k}" for k in range(1, len(captions) + 1)], (md.name, captions)


def _source_text(docname: str) -> str:
    """A page's source and, for a chapter, the outputs stored in its .ipynb (where glued values come from)."""
    text = (REPO / f"{docname}.md").read_text(encoding="utf-8")
    ipynb = REPO / f"{docname}.ipynb"
    return text + (ipynb.read_text(encoding="utf-8") if ipynb.is_file() else "")


def test_quotes_and_dashes_are_not_rewritten(measured):
    for (docname, width), m in measured.items():
        if width != 1280:
            continue
        closing_pairs = re.findall(r"”[^“”\n]{1,40}”", m["text"])
        assert not closing_pairs, f"{docname}: quotes that open with a closing mark: {closing_pairs[:5]}"
        source = _source_text(docname)
        assert m["text"].count("–") <= source.count("–") + source.count("\\u2013"), (
            f"{docname}: en dashes the source does not have (a '--' turned into '–')")


def test_glued_text_carries_no_markdown(measured):
    """{glue:text} pastes a value as plain text, so Markdown in it shows as typed. A value that needs
    code or math is glued as IPython.display.Markdown and pasted with {glue:md}."""
    found = {d: [g[:80] for g in m["glued"] if "`" in g or re.search(r"\$[^$\s][^$]*\$", g)]
             for (d, w), m in measured.items() if w == 1280}
    found = {d: g for d, g in found.items() if g}
    assert not found, f"glued values with literal Markdown: {json.dumps(found, ensure_ascii=False)}"


def test_ui_strings_are_chinese(measured):
    for (docname, _width), m in measured.items():
        english = [p for p in m["prompts"] if re.search(r"[A-Za-z]{3,}", p)]
        assert not english, f"{docname}: English prompts {english}"
        assert all(box == pages.SEARCH_BOX for box in m["search_box"]), (docname, m["search_box"])


def test_each_chapter_says_how_long_it_took_to_execute(measured):
    chapters = {book.docname(md) for md in book.chapters()}
    for (docname, width), m in measured.items():
        if width != 1280:
            continue
        if docname not in chapters:
            assert not m["runtime"], f"{docname} is not a chapter, yet says how long it took: {m['runtime']}"
            continue
        (said,) = m["runtime"]  # exactly one sentence, right after the first paragraph under the title
        assert said["after"] == "P" and said["first_p"], f"{docname}: the sentence is not after the first paragraph"
        assert "从头到尾执行用了" in said["text"] and " 核）" in said["text"], f"{docname}: {said['text']}"
        assert said["href"] and said["href"].split("#")[0].endswith("provenance.html"), (docname, said["href"])


# ---- no browser ----

def test_pair_quote_texts():
    assert pages.pair_quote_texts(['什么叫"计算最优"，', '"预期"']) == ["什么叫“计算最优”，", "“预期”"]
    assert pages.pair_quote_texts(['一个 "', '跨了两段"']) == ["一个 “", "跨了两段”"]
    assert pages.pair_quote_texts(['12" 的屏幕']) == ['12" 的屏幕']  # odd: left alone
    assert pages.pair_quote_texts(["残差的符号是 +--+"]) == ["残差的符号是 +--+"]


def test_translate_prompt():
    assert pages.translate_prompt("显示source") == "显示代码"
    assert pages.translate_prompt("隐藏outputs") == "隐藏输出"
    assert pages.translate_prompt("显示output") == "显示输出"
    assert pages.translate_prompt("显示content") == "显示这一格"


def test_figures_are_renumbered_per_chapter():
    class Env:
        toc_fignumbers = {}
    first, second = (book.docname(md) for md in book.chapters()[:2])
    Env.toc_fignumbers = {first: {"figure": {"a": (2,), "b": (1,)}}, second: {"figure": {"c": (3,)}},
                          "chapters/glossary": {"figure": {"d": (4,)}}}
    pages.number_figures_by_chapter(None, Env)
    assert Env.toc_fignumbers == {first: {"figure": {"b": (1, 1), "a": (1, 2)}}, second: {"figure": {"c": (2, 1)}},
                                  "chapters/glossary": {"figure": {"d": (4,)}}}

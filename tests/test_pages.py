"""The pages fit and read as Chinese: every page of _toc.yml in headless Chromium at 1280 and 390 px.

- Code cells and their outputs wrap at 1280 px: none scrolls sideways (_static/book.css).
- No page scrolls sideways at 390 px (long inline code breaks; figures and wide math scroll in their
  own boxes).
- Figure text is legible at both widths: each figure is shown at no less than LEGIBLE of its drawn
  size (the figures are drawn at 100 dpi, their text at 7-10 pt, so 10 pt reads at about 9.7 px).
- Figures are numbered per chapter: 图 N.1, 图 N.2, ... (bookbuild/pages.py), every one of them, with a
  caption in the cell's metadata or without (pages.FigureEveryImage).
- Every table renders as a table: no page's prose shows a Markdown table's rule (|---|), as a
  text/markdown output parsed by CommonMark did (_config.yml: nb_render_markdown_format).
- No page links to the general index (the book has no index entries; _config.yml: html_use_index).
- At 1280 and 390 px (_static/layout.css): a printed table (pages.table_like) keeps one line per line
  and scrolls instead; a wrapped code line indents its continuation; a word in a table cell is never
  broken inside (a hyphen may end a line); on a phone a figure fits its column or its caption says it
  scrolls (_static/layout.js).
- Quotation marks and dashes: no ”…” (two closing quotes), no en dash the source does not have (so a
  glued "+--+" stays four signs).
- Glued text carries no Markdown (a backtick or a $ shows literally in a {glue:text} value).
- The UI strings are Chinese: the hidden cells' prompts, the search box, every tooltip and the footer
  (pages.UI_MESSAGES, bookbuild/templates/).
- Each chapter says on its first screen, right after its first paragraph, how long it took to execute and
  on which CPU, linking to the provenance page (bookbuild/provenance.py).

Uses the site and browser fixtures of tests/conftest.py (the session's strict build of the book, served
on 127.0.0.1; one Chromium). The unit tests at the end need neither.
"""
import json
import re

import pytest
from conftest import goto_ready
from test_browser import REPO, toc_pages

from bookbuild import book, pages

WIDTHS = (1280, 390)
CJK = re.compile("[\u4e00-\u9fff]")
LEGIBLE = 0.65  # shown width / drawn width of a figure: 10 pt at 100 dpi reads at 9 px or more

MEASURE_JS = """() => {
  const main = document.querySelector('main');
  const visible = (e) => e.getClientRects().length > 0;
  // the left edge of each line an element's text is laid out in, top to bottom
  const lineStarts = (e) => { const r = document.createRange(); r.selectNodeContents(e); const lines = [];
    for (const b of [...r.getClientRects()].filter(b => b.width > 0).sort((a, b) => a.top - b.top)) {
      const last = lines[lines.length - 1];  // a glyph of another font on the same line sits a pixel or two lower
      if (!last || b.top > last.top + b.height / 2) lines.push({top: b.top, left: b.left});
      else last.left = Math.min(last.left, b.left);
    }
    return lines.map(l => l.left); };
  const wide = (sel, keep = () => true) => [...main.querySelectorAll(sel)]
    .filter(e => keep(e) && e.scrollWidth > e.clientWidth + 1)
    .map(e => e.textContent.trim().slice(0, 60));
  return {
    page: document.documentElement.scrollWidth, viewport: window.innerWidth,
    code: wide('div.cell_input pre'),
    outputs: wide('div.cell_output pre', (e) => !e.closest('.book-columns')),  // a printed table may scroll
    columns: [...main.querySelectorAll('div.cell_output .book-columns pre')].filter(visible)
      .map(e => [e.textContent.replace(/\\n$/, '').split('\\n').length, lineStarts(e).length,
                 e.textContent.slice(0, 60)]),
    hanging: [...main.querySelectorAll('div.cell_input pre')].filter(visible).map(e => {
      const starts = lineStarts(e), x0 = Math.min(...starts);
      return [e.textContent.replace(/\\n$/, '').split('\\n').length, starts.length,
              starts.filter(x => x < x0 + 1).length, e.textContent.slice(0, 60)];
    }),
    figure_fit: [...main.querySelectorAll('div.cell_output img')].map(i => {
      const f = i.closest('figure'), c = f && f.querySelector(':scope > figcaption');
      return [i.getBoundingClientRect().width, f ? f.clientWidth : 0,
              c ? getComputedStyle(c, '::after').content : '', i.alt.slice(0, 30)];
    }),
    split_words: [...main.querySelectorAll('td, th')].flatMap(cell => {
      const split = [], walker = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
      for (let n = walker.nextNode(); n; n = walker.nextNode())
        for (const m of n.nodeValue.matchAll(/[A-Za-z0-9_.+]+/g)) {  // a hyphen may end a line
          const r = document.createRange(); r.setStart(n, m.index); r.setEnd(n, m.index + m[0].length);
          if (new Set([...r.getClientRects()].map(b => Math.round(b.top))).size > 1) split.push(m[0]);
        }
      return split;
    }),
    figures: [...main.querySelectorAll('div.cell_output img')]
      .map(i => [i.naturalWidth, i.getBoundingClientRect().width]),
    captions: [...main.querySelectorAll('.caption-number')].map(e => e.textContent.trim()),
    unnumbered: [...main.querySelectorAll('div.cell_output img')].filter(i => !i.closest('figure')
      ?.querySelector(':scope > figcaption .caption-number')).map(i => i.alt.slice(0, 40)),
    index_links: [...document.querySelectorAll('a[href], link[href]')].map(e => e.getAttribute('href'))
      .filter(h => /genindex/.test(h)),
    text: main.innerText,
    prose: [...main.querySelectorAll('p, li, td, th')].map(e => e.innerText).join('\\n'),
    glued: [...main.querySelectorAll('.pasted-text')].map(e => e.textContent),
    glued_bold: [...main.querySelectorAll('.pasted-text')].filter(e => e.parentElement && getComputedStyle(e)
      .fontWeight !== getComputedStyle(e.parentElement).fontWeight).map(e => e.textContent.slice(0, 30)),
    prompts: [...main.querySelectorAll('details.hide summary p')].map(e => e.textContent.trim()),
    search_box: [...document.querySelectorAll('input[name="q"]')].map(e => e.placeholder),
    // what the page says outside the article: tooltips (Bootstrap moves a title to data-bs-original-title)
    // and the footer's copyright
    tooltips: [...document.querySelectorAll('[title], [data-bs-title], [data-bs-original-title]')]
      .flatMap(e => ['title', 'data-bs-title', 'data-bs-original-title'].map(a => e.getAttribute(a)))
      .filter(t => t && t.trim()),
    footer: [...document.querySelectorAll('footer p, .bd-footer p')].map(e => e.textContent.trim()),
    uncued: [...main.querySelectorAll('div.cell_output .book-columns, .pst-scrollable-table-container, '
                                     + 'mjx-container[display="true"]')].filter(visible).filter(e => {
        const box = e.matches('.book-columns') ? e.querySelector('pre') : e;
        return box && box.scrollWidth > box.clientWidth + 1 && !getComputedStyle(e, '::after').content.includes('滑动');
      }).map(e => e.textContent.trim().slice(0, 60)),
    runtime: [...main.querySelectorAll('p.chapter-runtime')].map(e => ({
      text: e.textContent, after: e.previousElementSibling?.tagName,
      first_p: e === main.querySelector('section > p:not(.chapter-runtime)')?.nextElementSibling,
      href: e.querySelector('a')?.getAttribute('href') ?? null})),
  };
}"""


@pytest.fixture(scope="module")
def measured(site, browser):
    """What MEASURE_JS finds on every page at each width: {(docname, width): {...}}."""
    found = {}
    for width in WIDTHS:
        context = browser.new_context(viewport={"width": width, "height": 900})
        for docname in toc_pages():
            page = context.new_page()
            goto_ready(page, f"{site}/{docname}.html")
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
def test_what_scrolls_sideways_says_so(measured, width):
    # a printed table, an HTML table or a formula cut at the right shows no scrollbar with overlay scrollbars:
    # each that scrolls carries the line layout.css adds under it
    uncued = {d: m["uncued"] for (d, w), m in measured.items() if w == width and m["uncued"]}
    assert not uncued, f"cut at {width} px with no word that it scrolls: {json.dumps(uncued, ensure_ascii=False)}"


@pytest.mark.parametrize("width", WIDTHS)
def test_figure_text_is_legible(measured, width):
    small = {d: [f"{shown:.0f} of {drawn} px" for drawn, shown in m["figures"] if drawn and shown / drawn < LEGIBLE]
             for (d, w), m in measured.items() if w == width}
    small = {d: s for d, s in small.items() if s}
    assert not small, f"figures shown below {LEGIBLE:.0%} of their drawn size at {width} px: {small}"


def test_figures_are_numbered_by_chapter(measured):
    counted = {}  # a chapter's figures count on across its section pages, in reading order
    for md in book.chapters():
        n = book.chapter_number(md)
        captions = measured[book.docname(md), 1280]["captions"]
        first = counted.get(n, 0) + 1
        assert captions == [f"图 {n}.{k}" for k in range(first, first + len(captions))], (md.name, captions)
        counted[n] = first - 1 + len(captions)


@pytest.mark.parametrize("width", WIDTHS)
def test_printed_tables_keep_their_columns(measured, width):
    # an output whose lines are a table (pages.table_like) scrolls rather than wraps: one line per line
    wrapped = {d: [t for lines, shown, t in m["columns"] if shown > lines]
               for (d, w), m in measured.items() if w == width}
    wrapped = {d: t for d, t in wrapped.items() if t}
    assert sum(len(m["columns"]) for (d, w), m in measured.items() if w == width) > 20
    assert not wrapped, f"printed tables whose lines wrap at {width} px: {json.dumps(wrapped, ensure_ascii=False)}"


@pytest.mark.parametrize("width", WIDTHS)
def test_wrapped_code_indents_its_continuation(measured, width):
    # lines that start at the cell's left edge: one per source line at most, however many wrap
    flat = {d: [t for lines, shown, at_left, t in m["hanging"] if shown > lines and at_left > lines]
            for (d, w), m in measured.items() if w == width}
    flat = {d: t for d, t in flat.items() if t}
    assert any(shown > lines for (d, w), m in measured.items() if w == 390 for lines, shown, _, _ in m["hanging"])
    assert not flat, (f"code cells whose wrapped lines start at the left edge at {width} px: "
                      f"{json.dumps(flat, ensure_ascii=False)}")


def test_figures_fit_a_phone_or_say_that_they_scroll(measured):
    cut = {d: [alt for shown, box, after, alt in m["figure_fit"] if shown > box + 1 and "滑动" not in after]
           for (d, w), m in measured.items() if w == 390}
    cut = {d: c for d, c in cut.items() if c}
    assert not cut, f"figures wider than a 390 px phone's column that do not say they scroll: {cut}"


@pytest.mark.parametrize("width", WIDTHS)
def test_tables_break_between_words(measured, width):
    split = {d: m["split_words"][:5] for (d, w), m in measured.items() if w == width and m["split_words"]}
    assert not split, f"words broken across lines in table cells at {width} px: {split}"


def test_table_like():
    assert pages.table_like("dtype     bits        max\nfloat32     32    3.4e+38\nbfloat16    16    3.4e+38\n")
    assert pages.table_like("| a | b |\n| 1 | 2 |\n| 3 | 4 |\n")
    assert not pages.table_like("k=2: micro-batch 16\nthe loss is lower\nsame loss: True\n")
    assert not pages.table_like("fp32 eager   432.7 ms\nfp32 compile 330.2 ms\n")  # two lines: no table yet


def test_every_figure_is_numbered(measured):
    # a figure whose cell has no `mystnb: figure:` caption is numbered too (pages.FigureEveryImage)
    found = {d: m["unnumbered"] for (d, w), m in measured.items() if w == 1280 and m["unnumbered"]}
    assert not found, f"figures without a 图 N.M number: {json.dumps(found, ensure_ascii=False)}"


def test_no_page_links_to_an_empty_index(measured):
    # the book has no index entries: Sphinx's genindex page was empty, linked from every page's head
    found = {d: m["index_links"] for (d, w), m in measured.items() if w == 1280 and m["index_links"]}
    assert not found, f"pages that link to the general index: {found}"


TABLE_RULE = re.compile(r"\|\s*:?-{3,}:?\s*\|")


def test_a_table_rule_is_found_in_text():
    assert TABLE_RULE.search("| model | N |\n|---|---:|") and TABLE_RULE.search("| :--- | --- |")
    assert not TABLE_RULE.search("损失从 3.2 降到 2.9 --- 见上表") and not TABLE_RULE.search("a | b")


def test_every_table_renders_as_a_table(measured):
    # a text/markdown output (display(Markdown(table))) is parsed as MyST, which has tables
    # (_config.yml: nb_render_markdown_format); CommonMark, myst-nb's default, showed the pipes as text
    # the page's prose (paragraphs, list items, table cells); a code cell may well hold a table's source
    found = {d: TABLE_RULE.findall(m["prose"])[:3] for (d, w), m in measured.items() if w == 1280}
    found = {d: f for d, f in found.items() if f}
    assert not found, f"pages whose text shows a Markdown table's rule (a table that did not render): {found}"


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


def test_glued_text_reads_as_the_sentence_around_it(measured):
    """myst-nb sets every glued value in bold (span.pasted-text); a measured number is part of its sentence,
    so the book's CSS sets it in the weight of the text around it."""
    bold = {d: m["glued_bold"] for (d, w), m in measured.items() if w == 1280 and m["glued_bold"]}
    assert not bold, f"glued text in another weight than its sentence: {json.dumps(bold, ensure_ascii=False)[:600]}"


def test_ui_strings_are_chinese(measured):
    for (docname, _width), m in measured.items():
        english = [p for p in m["prompts"] if re.search(r"[A-Za-z]{3,}", p)]
        assert not english, f"{docname}: English prompts {english}"
        assert all(box == pages.SEARCH_BOX for box in m["search_box"]), (docname, m["search_box"])
        english = sorted({t for t in m["tooltips"] + m["footer"] if not CJK.search(t)})
        assert not english, f"{docname}: tooltips or footer without a Chinese word: {english}"


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


def test_figure_numbers_count_on_across_a_chapters_section_pages(monkeypatch):
    class Env:
        toc_fignumbers = {}
    chapter, section, nxt = (book.REPO / "chapters" / n for n in ("09_a.md", "09_1_b.md", "10_c.md"))
    monkeypatch.setattr(book, "chapters", lambda: [chapter, section, nxt])
    monkeypatch.setattr(book, "chapter_number", {chapter: 9, section: 9, nxt: 10}.__getitem__)
    Env.toc_fignumbers = {book.docname(chapter): {"figure": {"a": (1,), "b": (2,)}},
                          book.docname(section): {"figure": {"c": (3,)}}, book.docname(nxt): {"figure": {"d": (4,)}}}
    pages.number_figures_by_chapter(None, Env)
    assert [v for by in Env.toc_fignumbers.values() for v in by["figure"].values()] == [(9, 1), (9, 2), (9, 3), (10, 1)]


def test_printing_opens_what_the_screen_folds_and_says_print_in_simplified_chinese(site, browser):
    """The theme's download menu said 列印成 PDF (its zh_CN catalog); printed, the hidden code and the
    exercises' answers were left out (a closed <details> prints closed). _static/layout.js fixes both."""
    page = browser.new_page()
    goto_ready(page, f"{site}/chapters/01_data_model.html")
    assert "列印" not in page.content() and "打印成 PDF" in page.content()
    closed = "() => [...document.querySelectorAll('main details')].filter(d => !d.open).length"
    before = page.evaluate(closed)
    assert before > 0  # hidden cells and answers, folded on screen
    page.evaluate("() => window.dispatchEvent(new Event('beforeprint'))")
    assert page.evaluate(closed) == 0
    page.evaluate("() => window.dispatchEvent(new Event('afterprint'))")
    assert page.evaluate(closed) == before
    page.close()


def test_the_estimate_is_stated_once_in_prose(measured):
    """Each chapter's first cell glues its run-time estimate into the prose (measure.estimate_run_time); its
    English printout repeated it, rounded otherwise (预计约 40 秒 beside "estimated run time here: 42 s"), so
    the cell is tagged remove-output on the page (readers running the notebook still see the line)."""
    repeated = sorted({d for (d, _w), m in measured.items() if "estimated run time here" in m["text"]
                       or "no stored run of" in m["text"]})
    assert not repeated, f"pages that print the estimate beside the prose's: {repeated}"

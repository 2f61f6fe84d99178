"""The PDF as a reader meets it, read with poppler (pdftotext, pdffonts, pdftoppm).

Builds the PDF once (`python -m bookbuild.pdf`, which executes only chapters missing from the execution
cache), after the HTML build if the tests have not made one for these inputs. Checks: every chapter's
title opens a page, in _toc.yml's order; the page count; every glued value of chapters 2, 9 and 12,
in order, exactly as the built HTML shows it; every word of the tables of chapters 8 and 12, the glossary
and the provenance page whole, and no cell wider than its column; no text below the text block;
no source of a hide-input cell; as many numbered figures as the HTML, with the same numbers; a CJK font
embedded and a Chinese paragraph extracted back as the same characters; no unresolved reference; no
line of code or output past the margin. A few pages are rendered to PNG in _build/pdf/pages/ for a person
to look at.

Skips (one line) without the Debian packages bookbuild/pdf.py names; in CI (CI=true) that is a failure.
"""
import html.parser
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bookbuild import book, pdf
from bookbuild.cache import STAMP, inputs_hash

REPO = Path(__file__).resolve().parent.parent
HTML = REPO / "_build" / "html"
PAGES = pdf.OUT.parent / "pages"
PAGE_RANGE = (150, 240)  # 194 pages on A4 at 10 pt (179 when this test was written)
GLUED_CHAPTERS = ("02_speed", "09_scaling", "12_budget")
TABLE_PAGES = ("08_comm_threshold", "08_1_bytes", "12_budget", "12_1_fit", "glossary", "provenance")  # wide, long
BODY_Y = (55, 785)  # A4 in points: the header's baseline is near 45, the body ends by 784, the footer from 791
FOOTER_Y = (789, 794)  # where the footer's lines start (page number, chapter title); nothing starts below
MISSING = pdf.missing_package() or (None if shutil.which("pdftotext") else "poppler-utils")
if MISSING and os.environ.get("CI") == "true":
    raise RuntimeError(f"CI builds the PDF: apt-get install {MISSING}")
pytestmark = pytest.mark.skipif(bool(MISSING), reason=f"no PDF build here: apt-get install {MISSING}")


def html_is_current() -> bool:
    """Whether the HTML build another test made (test_browser's, or README's command 1) is of these
    inputs and newer than every page's source: then it is not built again."""
    if not STAMP.is_file() or STAMP.read_text() != inputs_hash():
        return False
    built_at = STAMP.stat().st_mtime
    return all((HTML / f"{book.docname(md)}.html").is_file() and md.stat().st_mtime < built_at
               for md in book.pages())


@pytest.fixture(scope="module")
def built(request):
    """The PDF's text, one string per page; built after the HTML, which the glued values come from (the
    session's strict build, tests/conftest.py's book_build, where no current one is there)."""
    if not html_is_current():
        request.getfixturevalue("book_build")
    assert subprocess.run([sys.executable, "-m", "bookbuild.pdf"], cwd=REPO).returncode == 0
    text = subprocess.run(["pdftotext", "-enc", "UTF-8", str(pdf.OUT), "-"], capture_output=True,
                          text=True, check=True).stdout
    return text.split("\f")[:-1]  # pdftotext ends every page with a form feed


@pytest.fixture(scope="module")
def bodies(built):
    """Each page's text without its running header and footer (the book's title above, the page number
    and the chapter's or section's title below): A4's text block alone, read by cropping. A sentence
    that runs on to the next page is then whole when the pages are joined; with the furniture, a value
    the page broke after its hyphen ("2.1e-" | page number, titles | "06") was not found."""
    top, bottom = BODY_Y
    text = subprocess.run(["pdftotext", "-enc", "UTF-8", "-x", "0", "-y", str(top), "-W", "600",
                           "-H", str(bottom - top), str(pdf.OUT), "-"], capture_output=True, text=True,
                          check=True).stdout
    pages = text.split("\f")[:-1]
    assert len(pages) == len(built)
    return pages


def squeeze(text: str) -> str:
    """Text without its line breaks and spaces: pdftotext breaks lines where the page does."""
    return re.sub(r"\s+", "", text)


def opens_with(page: str, title: str) -> bool:
    """Whether the page starts with the title. pdftotext may give the lines of a title that wraps out of
    order ("第10章 / 跑通 / GPU 训练脚本：先在 CPU 上"): the page's first characters are the title's."""
    head = squeeze(page)[:len(squeeze(title))]
    return sorted(head) == sorted(squeeze(title))


def holds_heading(page: str, title: str) -> bool:
    """Whether the page has the title as a heading: a line of its own, or two when it wraps or when pdftotext
    sets a section's number apart from its words (the chapter's own page names its section pages by title
    inside sentences, which does not count)."""
    lines = [squeeze(line) for line in page.splitlines() if line.strip()]  # "2.1" and the title may stand apart
    return squeeze(title) in lines + [a + b for a, b in zip(lines, lines[1:])]


def opening_pages(pages) -> list[int]:
    """The page each of _toc.yml's pages opens on, in order: for a chapter, a page that starts with its title
    (a chapter's first page has no running header; a long title takes two lines); for a section page (a
    LaTeX section inside its chapter, which starts no new page), the first page from there on that holds its
    title. The front page is the chapter pdf.FRONT_CHAPTER."""
    sections = {md for chapter in book.chapter_pages() for md in book.sections(chapter)}
    titles = [(pdf.FRONT_CHAPTER, False)] + [(book.title(md), md in sections) for md in book.pages()[1:]]
    found, at = [], 0
    for title, inside in titles:
        at = next((i for i in range(at, len(pages))
                   if (holds_heading(pages[i], title) if inside else opens_with(pages[i], title))), None)
        assert at is not None, f"no page after page {found[-1] + 1 if found else 0} opens with {title!r}"
        found.append(at)
    return found


class Pasted(html.parser.HTMLParser):
    """The glued values of a built page: the text of each span.pasted-text."""

    def __init__(self):
        super().__init__()
        self.values, self.depth = [], 0

    def handle_starttag(self, tag, attrs):
        if self.depth:
            self.depth += tag == "span"
        elif tag == "span" and "pasted-text" in (dict(attrs).get("class") or "").split():
            self.depth = 1
            self.values.append("")

    def handle_endtag(self, tag):
        if self.depth and tag == "span":
            self.depth -= 1

    def handle_data(self, data):
        if self.depth:
            self.values[-1] += data


class TableCells(html.parser.HTMLParser):
    """The text of each cell (td, th) of a built page's tables, without its math (TeX in the HTML)."""

    def __init__(self):
        super().__init__()
        self.cells, self.cell, self.math = [], None, 0

    def handle_starttag(self, tag, attrs):
        if tag in ("td", "th"):
            self.cell = ""
        elif self.math or (tag == "span" and "math" in (dict(attrs).get("class") or "").split()):
            self.math += tag == "span"

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self.cell is not None:
            self.cells.append(self.cell)
            self.cell = None
        elif self.math and tag == "span":
            self.math -= 1

    def handle_data(self, data):
        if self.cell is not None and not self.math:
            self.cell += data


def table_cells(name: str) -> list[str]:
    parser = TableCells()
    parser.feed((HTML / "chapters" / f"{name}.html").read_text(encoding="utf-8"))
    return parser.cells


def words(text: str) -> list[str]:
    """The runs of Latin letters, digits and signs in text, which a line never breaks inside (124M,
    16,384, 2.1e10): the pieces a clipped or cut table cell would lose. LaTeX sets an apostrophe as ’."""
    return re.findall(r"[!-~]+", text.replace("\u2019", "'"))


def glued_values(name: str) -> list[str]:
    parser = Pasted()
    parser.feed((HTML / "chapters" / f"{name}.html").read_text(encoding="utf-8"))
    return parser.values


def test_chapters_in_order_and_page_count(built):
    starts = opening_pages(built)
    assert PAGE_RANGE[0] <= len(built) <= PAGE_RANGE[1], f"{len(built)} pages"
    names = [md.stem for md in book.pages()]
    for md in book.chapters():  # provenance.py's sentence at each page's start, as on the web
        first = starts[names.index(md.stem)]
        assert "你的机器上会不同" in squeeze("".join(built[first:first + 2])), md.name
    assert "这份PDF（python-mbookbuild.pdf）构建于" in squeeze("".join(built[starts[-1]:]))
    assert squeeze(pdf.CALCULATOR) in squeeze("".join(built[starts[names.index("12_2_plan")]:]))


@pytest.mark.parametrize("name", GLUED_CHAPTERS)
def test_glued_values_as_in_the_html(built, bodies, name):
    names = [md.stem for md in book.pages()]
    starts = opening_pages(built)
    k = names.index(name)
    # to the page the next one opens on, inclusive: a section page (02_1_peak) opens below the end of the one before
    chapter = squeeze("".join(bodies[starts[k]:starts[k + 1] + 1 if k + 1 < len(starts) else None]))
    values = glued_values(name)
    assert len(values) > 10, f"{name}: only {len(values)} glued values in the HTML"
    at = 0
    for value in values:  # each where the HTML has it, after the one before
        where = chapter.find(squeeze(value), at)
        assert where >= 0, f"{name}: glued value {value!r} not in the PDF after {chapter[max(0, at - 60):at]!r}"
        at = where + len(squeeze(value))


def test_tables_hold_their_cells_whole(built, bodies):
    """Every word of every table cell of TABLE_PAGES is a word of its pages' text, and no cell is wider than
    its column (LaTeX's overfull boxes in a table): the cell under the next one's colour hid its end, 124M
    read 124Ɱ and 16,384 16,38."""
    names = [md.stem for md in book.pages()]
    starts = opening_pages(built)
    for name in TABLE_PAGES:
        k = names.index(name)
        pages = bodies[starts[k]:starts[k + 1] + 1 if k + 1 < len(starts) else None]
        found = set(words("\n".join(pages)))
        cells = table_cells(name)
        assert cells, f"{name}: no table in the HTML"
        missing = sorted({w for cell in cells for w in words(cell) if w not in found})
        assert not missing, f"{name}: table cells' words not whole in the PDF: {missing[:20]}"
    log = (pdf.LATEX / f"{pdf.NAME}.log").read_text(encoding="utf-8", errors="replace")
    tex = (pdf.LATEX / f"{pdf.NAME}.tex").read_text(encoding="utf-8")
    assert not pdf.overfull_tables(log, tex)


def test_nothing_runs_into_the_footer(built):
    """Each page's text ends above its footer: a table longer than the page ran below it (y 807-834)."""
    layout = subprocess.run(["pdftotext", "-enc", "UTF-8", "-bbox-layout", str(pdf.OUT), "-"],
                            capture_output=True, text=True, check=True).stdout
    line = re.compile(r'<line xMin="[\d.]+" yMin="([\d.]+)" xMax="[\d.]+" yMax="([\d.]+)">(.*?)</line>', re.S)
    low = []
    for number, page in enumerate(layout.split("<page ")[1:], start=1):
        for top, bottom, words_xml in line.findall(page):
            footer = FOOTER_Y[0] <= float(top) < FOOTER_Y[1]
            if not footer and float(bottom) > BODY_Y[1] + 2:
                low.append((number, float(top), "".join(re.findall(r">([^<]*)</word>", words_xml))[:30]))
    assert not low, f"text below the text block (page, y, text): {low[:10]}"


def hidden_lines() -> dict[str, str]:
    """{page: a line of one of its hide-input cells} for each such cell: the line of 20-70 characters (one that
    fits a line of the PDF) found in no cell the book shows."""
    from bookbuild.cache import as_the_build_reads
    cells = [(md.stem, c) for md in book.chapters() for c in as_the_build_reads(md).cells if c.cell_type == "code"]
    hidden = lambda c: {"hide-input", "hide-cell"} & set(c.metadata.get("tags", []))  # noqa: E731
    shown = squeeze("".join(c.source for _, c in cells if not hidden(c)))
    picked = {}
    for stem, cell in cells:
        lines = [squeeze(x) for x in cell.source.splitlines() if 20 <= len(x.strip()) <= 70]
        lines = [x for x in lines if x not in shown]
        if hidden(cell) and lines:
            picked[f"{stem}: {max(lines, key=len)}"] = max(lines, key=len)
    return picked


def test_hidden_code_is_left_out(built):
    """A hide-input cell's source, folded away on the web page, is not printed; its outputs are."""
    text = squeeze("".join(built))
    lines = hidden_lines()
    assert len(lines) > 20
    printed = [where for where, line in lines.items() if line in text]
    assert not printed, f"hide-input cells printed in the PDF: {printed[:5]}"


def test_figures_as_in_the_html(built):
    on_pages = re.compile(r"图 (\d+\.\d+)")
    numbered = re.compile(r'class="caption-number">图 (\d+\.\d+)')
    in_html = sorted(set(n for page in HTML.glob("chapters/*.html")
                         for n in numbered.findall(page.read_text(encoding="utf-8"))))
    captions = sorted(set(n for page in built for line in page.splitlines()
                          if (m := on_pages.match(line.strip())) for n in [m.group(1)]))
    assert in_html and captions == in_html
    images = subprocess.run(["pdfimages", "-list", str(pdf.OUT)], capture_output=True, text=True, check=True)
    n_html = sum(len(re.findall(r"<img [^>]*src=\"[^\"]*_images/", p.read_text(encoding="utf-8")))
                 for p in HTML.glob("chapters/*.html"))
    n_pdf = sum(1 for line in images.stdout.splitlines()[2:] if line.split()[2] == "image")
    assert n_pdf == n_html


def test_cjk_font_embedded_and_text_extracts(built):
    fonts = subprocess.run(["pdffonts", str(pdf.OUT)], capture_output=True, text=True, check=True).stdout
    cjk = [line for line in fonts.splitlines() if "CJK" in line]
    assert cjk and all(line.split()[-5] == "yes" for line in cjk), fonts  # the "emb" column
    front = (REPO / "chapters" / "00_front.md").read_text(encoding="utf-8")
    paragraph = next(p for p in front.split("\n\n") if p.startswith("这是一本可以执行的书"))
    assert squeeze(paragraph) in squeeze("".join(built))


def test_no_unresolved_reference(built):
    assert not [i + 1 for i, page in enumerate(built) if "??" in page]


def test_code_stays_inside_the_page(built):
    log = (pdf.LATEX / f"{pdf.NAME}.log").read_text(encoding="utf-8", errors="replace")
    overfull = pdf.overfull_verbatim(log)
    assert len(overfull) <= pdf.OVERFULL_VERBATIM_ALLOWED, overfull


def test_pages_rendered_for_a_person(built):
    starts = opening_pages(built)
    names = [md.stem for md in book.pages()]
    figure = next(i for i, page in enumerate(built) if re.search(r"^图 \d+\.\d+", page, re.M))
    code = next(i for i in range(starts[names.index("02_speed")], len(built)) if "print(" in built[i])
    shutil.rmtree(PAGES, ignore_errors=True)
    PAGES.mkdir(parents=True)
    for label, index in [("chapter-opening", starts[names.index("09_scaling")]), ("figure", figure), ("code", code)]:
        subprocess.run(["pdftoppm", "-png", "-r", "80", "-f", str(index + 1), "-l", str(index + 1),
                        "-singlefile", str(pdf.OUT), str(PAGES / f"{label}-p{index + 1}")], check=True)
    assert len(list(PAGES.glob("*.png"))) == 3


def test_the_front_pages_pdf_link_resolves_in_a_local_build(built):
    """The front page's 下载 PDF links ../train-faster-larger.pdf from chapters/: bookbuild.pdf puts the
    PDF there, so the link is not a 404 in a locally built book (it was, before: only the Pages workflow
    copied it)."""
    front = (HTML / "chapters" / "00_front.html").read_text(encoding="utf-8")
    links = [h for h in re.findall(r'href="([^"#]+\.pdf)"', front)]
    assert links, "the front page has no PDF link"
    for href in links:
        target = (HTML / "chapters" / href).resolve()
        assert target.is_file(), f"{href} from chapters/ is not in the built book"
        assert target.read_bytes() == pdf.OUT.read_bytes()

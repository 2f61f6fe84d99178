"""The book as a PDF, from the same executed outputs as the web pages.

    python -m bookbuild.pdf     # writes _build/pdf/train-faster-larger.pdf

Jupyter Book's LaTeX builder (Sphinx), then latexmk with xelatex. The chapters' outputs come from the
execution cache that the HTML build and nbval fill (cache.py): a chapter found there is not executed
again; one that is not is executed, and the command says which first. Nothing is installed and nothing
is fetched: a missing TeX program, TeX package or font is named by the Debian package that holds it.

The Sphinx side (setup(), from sphinx_ext.py) only acts in a LaTeX build:
- the preamble: xeCJK with the Noto CJK fonts (Sphinx loads xeCJK only for `language: zh`, and this
  book is zh_CN), the labels in Chinese (目录, 图/表 come from Sphinx's zh_CN messages), chapters
  without LaTeX's own numbers (each title carries its 第N章), code and outputs wrapped at the margin;
- figures and tables numbered as the web pages number them: the number pages.py put in the
  environment (图 6.1) is the one LaTeX prints, not a count of its own;
- what a PDF cannot hold (the calculator in chapter 12, the search) is one sentence with the command
  that prints the same; a hide-input cell's code, folded away on the web, is left out (its outputs stay);
- tables sized by their content (fit_table), wrapped code hanging at its own indent (hang_code_lines),
  links upright;
- the front page's "下载 PDF" links the file beside the web pages (LinkToThePdf).

No EPUB: Sphinx's epub builder is an HTML builder, so it would take what the HTML build adds for the
browser (chapter 12's calculator as raw HTML, and pyodide.py's 13 MB runtime in its static files), and
it would need a test of its own like tests/test_pdf.py; neither is done.
"""
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from docutils import nodes
from sphinx.transforms.post_transforms import SphinxPostTransform

from . import book
from .cache import BUILD, execution_cache, page_keys, run_jupyter_book

NAME = "train-faster-larger"   # the PDF's file name, = latex.latex_documents.targetname in _config.yml
LATEX = BUILD / "latex"         # where Jupyter Book's LaTeX builder writes the .tex
OUT = BUILD / "pdf" / f"{NAME}.pdf"

CJK_FONTS = {"main": "Noto Serif CJK SC", "sans": "Noto Sans CJK SC", "mono": "Noto Sans Mono CJK SC"}
# Latin letters, digits and code: DejaVu has the superscripts (10⁻⁸, Qᵀ) that the Noto CJK fonts lack
LATIN_FONTS = {"main": "DejaVu Serif", "sans": "DejaVu Sans", "mono": "DejaVu Sans Mono"}

# What the build needs, and the Debian package that has it (the Debian names are what CI installs).
PROGRAMS = {"xelatex": "texlive-xetex", "latexmk": "latexmk", "kpsewhich": "texlive-xetex",
            "fc-list": "fontconfig"}
TEX_FILES = {"xeCJK.sty": "texlive-lang-chinese", "fncychap.sty": "texlive-latex-extra",
             "tabulary.sty": "texlive-latex-extra", "capt-of.sty": "texlive-latex-extra",
             "needspace.sty": "texlive-latex-extra", "wrapfig.sty": "texlive-latex-extra",
             "fontspec.sty": "texlive-xetex"}
FONT_PACKAGES = {"fonts-noto-cjk": CJK_FONTS, "fonts-dejavu-core": LATIN_FONTS}
DEBIAN = ("texlive-xetex", "texlive-lang-chinese", "texlive-latex-extra", "latexmk", "fonts-noto-cjk",
          "fonts-dejavu-core")


def missing_package() -> str | None:
    """The Debian package whose program, TeX file or font the build lacks first, or None."""
    for program, package in PROGRAMS.items():
        if shutil.which(program) is None:
            return package
    found = subprocess.run(["kpsewhich", *TEX_FILES], capture_output=True, text=True).stdout.split()
    for name, package in TEX_FILES.items():
        if not any(Path(f).name == name for f in found):
            return package
    families = subprocess.run(["fc-list", ":", "family"], capture_output=True, text=True).stdout
    for package, fonts in FONT_PACKAGES.items():
        if not all(font in families for font in fonts.values()):
            return package
    return None


# ---- the Sphinx side: only what a LaTeX build reads ----

# The page's text width holds 80 characters of code at \footnotesize in a 10 pt A4 book; a longer line
# is wrapped at a space or punctuation, and one without either is cut anywhere (verbatimforcewraps).
# A wrapped line hangs at its own indent plus 4 (\BookHangBy, which hang_code_lines puts
# before each line that may wrap).
# Links, which Sphinx sets in \emph, are upright: the Latin words of a Chinese sentence were italic.
PREAMBLE = r"""
\usepackage{xeCJK}
\setCJKmainfont{%(main)s}
\setCJKsansfont{%(sans)s}
\setCJKmonofont{%(mono)s}
\xeCJKsetup{CJKecglue={\hskip 0.2em plus 0.1em minus 0.05em}}
\renewcommand{\contentsname}{目录}
\renewcommand{\indexname}{索引}
\makeatletter\renewcommand{\@pnumwidth}{2.2em}\makeatother
\setcounter{secnumdepth}{-1}
\setcounter{tocdepth}{1}
\protected\def\sphinxcrossref#1{#1}
\protected\def\sphinxtermref#1{#1}
\makeatletter
\newcolumntype{\X}[2]{>{\raggedright\arraybackslash}p{\dimexpr
      (\linewidth-\spx@arrayrulewidth)*#1/#2-\tw@\tabcolsep-\spx@arrayrulewidth\relax}}
\makeatother
\newcommand\BookHangBy[1]{\ifinner\else
  \leftskip=\numexpr#1+4\relax\fontcharwd\font`X\relax\kern-\leftskip\nobreak\fi}
"""

HANG_MOST = 60  # the deepest indent a wrapped line hangs at (then plus 4)


def hang_macro(indent: int) -> str:
    """The name of the macro that hangs a line's continuation at indent + 4: an argument, {4}, would be
    torn from it by Sphinx's verbatimforcewraps, which takes a line apart token by token."""
    n, name = min(indent, HANG_MOST), ""
    while True:
        n, digit = divmod(n, 26)
        name = "abcdefghijklmnopqrstuvwxyz"[digit] + name
        if not n:
            return "bookhang" + name


LATEX_ELEMENTS = {
    "papersize": "a4paper",
    "pointsize": "10pt",
    # Sphinx's xelatex default would be FreeSerif, which is not installed
    "fontpkg": "\\setmainfont{%(main)s}[Scale=0.92]\n\\setsansfont{%(sans)s}[Scale=0.92]\n"
               "\\setmonofont{%(mono)s}[Scale=0.92]\n" % LATIN_FONTS,
    "preamble": PREAMBLE % CJK_FONTS + "".join("\\def\\%s{\\BookHangBy{%d}}\n" % (hang_macro(n), n)
                                               for n in range(HANG_MOST + 1)),
    "fncychap": "",   # its styles print "CHAPTER ONE"; a chapter's title says 第1章 itself
    "babel": "",
    "polyglossia": "",
    # no formatcom=\xeCJKVerbAddon (what Sphinx sets for `zh`): it keeps CJK columns aligned but
    # leaves no break between CJK characters, and a printed line of the corpus ran 88 pt off the page
    "fvset": "\\fvset{fontsize=\\footnotesize}",
    "sphinxsetup": "verbatimforcewraps=true, verbatimmaxunderfull=2, verbatimwithframe=true",
    "releasename": "",
    "printindex": "",
}


def latex_settings(app, config) -> None:
    """config-inited: the LaTeX builder's settings (an HTML build never reads them)."""
    config.latex_elements = {**LATEX_ELEMENTS, **(config.latex_elements or {})}


FRONT_CHAPTER = "前言"  # the front page's chapter in the PDF: its title is the book's, on the title page
CALCULATOR = ("网页上这里是预算计算器，它在浏览器里运行 code/budget.py，PDF 放不下它："
              "在仓库根目录运行 python code/budget.py --model 124M --gpus 8（--help 列出每个参数），"
              "打印的正是计算器对同样参数显示的文字。")
SEARCH = ("这是本书的 PDF 版，排的是和网页版同一批执行输出；网页版的全文搜索它没有：用 PDF 阅读器的查找，"
          "或在仓库根目录运行 grep -rn 要找的词 chapters/*.md，打印各章里含这个词的每一行。")


def _command_paragraph(sentence: str) -> nodes.paragraph:
    """The sentence as a paragraph, its commands (the runs of Latin text that start with python or
    grep) set as code."""
    para = nodes.paragraph()
    for i, piece in enumerate(re.split(r"((?:python|grep) [^，。（）]+|code/budget\.py)", sentence)):
        if piece:
            para += nodes.literal(piece, piece) if i % 2 else nodes.Text(piece)
    return para


def _pages(document) -> dict:
    """{id(node): page} for the nodes of the whole book's doctree, by the page each came from: the
    LaTeX builder inlines every page under an addnodes.start_of_file (whose children keep their
    parent links to the page's own doctree, so this goes down from each, not up)."""
    from sphinx import addnodes
    page_of = {}
    for start in document.findall(addnodes.start_of_file):  # outer pages first, inner ones overwrite
        for node in start.findall(nodes.Element):
            page_of[id(node)] = start["docname"]
    return page_of


# Tables. tabulary sized a column by its text's share and let an unbreakable word run into the next
# column (124M over its neighbour, 16,384 cut at 16,38), and a table longer than the page ran into the
# footer. fit_table gives each column its width from its content, in the largest size where every
# column holds its longest unbreakable word (and its short cells whole, where some size allows), with
# narrower gaps between many columns, ragged right (\X, redefined in PREAMBLE); a table of more than
# LONG_ROWS rows is a longtable, which breaks across pages.
TEXT_WIDTH_PT = 451.0   # A4 less Sphinx's 1 in margins
TABCOLSEP_PT = 6.0      # LaTeX's \tabcolsep, on either side of a column's text; half of it from MANY_COLUMNS
MANY_COLUMNS = 7
TABLE_SIZES = ((10, ""), (9, "\\small"), (8, "\\footnotesize"), (7, "\\scriptsize"))  # pt, command
LONG_ROWS = 12
WORD_SLACK_EM = 0.4  # _em is an estimate: a word's column is this much wider (124M ran 1 pt over)
SHORT_EM = 5  # a cell of up to this many em is kept on one line
_WIDE = re.compile("[\u2e80-\u9fff\uf900-\ufaff\uff00-\uffef\u3000-\u303f]")  # 1 em; Latin 0.6-0.75
_BREAKS = re.compile(f"\\s+|(?={_WIDE.pattern})|(?<={_WIDE.pattern})")  # where a cell's line may break


def _em(text: str) -> float:
    return sum(1.0 if _WIDE.match(ch) else 0.75 if "A" <= ch <= "Z" else 0.6 for ch in text)  # DejaVu Serif


def column_widths(cells: list[list[str]], width: float = TEXT_WIDTH_PT) -> tuple[int, float, list[float]]:
    """(font size, \\tabcolsep, each column's width; in pt) for a table of these cell texts (rows of columns):
    the largest TABLE_SIZES size where each column holds its longest unbreakable word (a Chinese character
    breaks anywhere) and its short cells whole; the room left goes to the columns whose longest cell is
    longer, each up to that cell's width, evenly (a column's width is at least its least, at most its whole)."""
    ncol = max(len(row) for row in cells)
    words = [max((_em(w) + WORD_SLACK_EM for row in cells if i < len(row) for w in _BREAKS.split(row[i]) if w),
                 default=0.0) for i in range(ncol)]
    whole = [max((_em(row[i]) for row in cells if i < len(row)), default=0.0) for i in range(ncol)]
    short = [max(w, min(n, SHORT_EM)) for w, n in zip(words, whole)]  # a short cell (第11章, 16 × 1) on one line
    sizes = [size for size, _ in TABLE_SIZES]
    sep = TABCOLSEP_PT if ncol < MANY_COLUMNS else TABCOLSEP_PT / 2
    size = next((z for z in sizes if sum(w * z + 2 * sep for w in short) <= width), None)
    if size is None:  # else the words whole at least
        short = words
        size = next((z for z in sizes if sum(w * z + 2 * sep for w in words) <= width), sizes[-1])
    least = [w * size + 2 * sep for w in short]
    most = [max(n * size + 2 * sep, m) for n, m in zip(whole, least)]
    if sum(most) <= width:  # everything on one line: the spare room in proportion
        return size, sep, [m * width / sum(most) for m in most]
    if sum(least) >= width:
        return size, sep, least
    low, high = 0.0, max(most)  # the level where the columns, each min(max(level, least), most), fill it
    for _ in range(50):
        level = (low + high) / 2
        low, high = (level, high) if sum(min(max(level, m), n) for m, n in zip(least, most)) < width else (low, level)
    return size, sep, [min(max(high, m), n) for m, n in zip(least, most)]


def _shown(node) -> str:
    """A cell's text as printed, roughly: math without its TeX commands and braces."""
    if isinstance(node, nodes.math):
        return re.sub(r"\\[A-Za-z]+|[{}^_]", "", node.astext())
    if isinstance(node, nodes.Text):
        return str(node)
    return " ".join(_shown(c) for c in node.children)


def fit_table(table: nodes.table) -> None:
    """The table's columns sized by column_widths, its font size set around it, long ones as longtables."""
    group = next(iter(table.findall(nodes.tgroup)), None)
    rows = list(table.findall(nodes.row))
    if group is None or not rows or any(e.get("morecols") or e.get("morerows") for e in table.findall(nodes.entry)):
        return
    specs = [c for c in group.children if isinstance(c, nodes.colspec)]
    cells = [[" ".join(_shown(e).split()) for e in row.children if isinstance(e, nodes.entry)] for row in rows]
    if any(len(row) != len(specs) for row in cells):
        return
    size, sep, widths = column_widths(cells)
    for spec, w in zip(specs, widths):
        spec["colwidth"] = max(1, round(w * 10))
    table["classes"] += ["colwidths-given"] + (["longtable"] if len(rows) > LONG_ROWS else [])
    command = dict(TABLE_SIZES)[size] + ("" if sep == TABCOLSEP_PT else "\\setlength{\\tabcolsep}{%gpt}" % sep)
    if command and table.parent is not None:
        at = table.parent.index(table)
        table.parent.insert(at + 1, nodes.raw("", "\\endgroup", format="latex"))
        table.parent.insert(at, nodes.raw("", "\\begingroup" + command, format="latex"))


class BookAsLatex(SphinxPostTransform):
    """The whole book's doctree, as the LaTeX builder assembled it: the web pages' figure numbers,
    the front page as one chapter, and a sentence where the web page has what a PDF cannot hold."""

    default_priority = 5   # before the references are resolved
    formats = ("latex",)

    def run(self, **kwargs) -> None:
        from . import pyodide
        for cell in list(self.document.findall(nodes.container)):
            if cell.get("nb_element") == "cell_code" and cell.get("hide_mode") in ("input", "all"):
                for source in [c for c in cell.children if c.get("nb_element") == "cell_code_source"]:
                    cell.remove(source)  # the web page folds it away; the PDF keeps only its outputs
        numbers = self.env.toc_fignumbers  # as pages.py numbered them for the web pages
        page_of = _pages(self.document)
        for figure in list(self.document.findall(nodes.figure)):
            page = page_of.get(id(figure), self.env.config.root_doc)
            number = next((numbers.get(page, {}).get("figure", {}).get(i) for i in figure["ids"]
                           if i in numbers.get(page, {}).get("figure", {})), None)
            if number:  # LaTeX would count its own; print the web page's number, inside the figure's group
                figure.insert(0, nodes.raw("", "\\renewcommand{\\thefigure}{%s}" % ".".join(map(str, number)),
                                           format="latex"))
        for raw in list(self.document.findall(nodes.raw)):
            if "html" in raw.get("format", "").split() and pyodide.MARK in raw.astext():
                raw.replace_self(_command_paragraph(CALCULATOR))
        front = self._front_as_a_chapter()
        if front is not None:  # first, under its title: the page's first paragraph leads into a list
            front.insert(1, _command_paragraph(SEARCH))

    def _front_as_a_chapter(self):
        """The root page's sections would each be a chapter (its title is the book's, left off): put
        them, with the paragraphs before them, in one chapter; the other pages' chapters follow it."""
        from sphinx import addnodes
        root = next(self.document.findall(nodes.section), None)
        if root is None:
            return None
        own = [c for c in root.children[1:] if not any(True for _ in c.findall(addnodes.start_of_file))]
        chapter = nodes.section(ids=["front-chapter"])
        chapter += nodes.title(FRONT_CHAPTER, FRONT_CHAPTER)
        for child in own:
            root.remove(child)
            chapter += child
        root.insert(1, chapter)
        return chapter


class LinkToThePdf(SphinxPostTransform):
    """The front page's link to the PDF (`[下载 PDF](../train-faster-larger.pdf)`): on the web a link to
    the file beside the pages (.github/workflows/book.yml puts it there), not a document Sphinx could
    find; in the PDF itself, its text."""

    default_priority = 5   # before MyST resolves (and warns about) a link to a file it does not know

    def run(self, **kwargs) -> None:
        from sphinx import addnodes
        for xref in list(self.document.findall(addnodes.pending_xref)):
            if xref.get("reftype") == "myst" and xref.get("reftarget", "").endswith(f"/{NAME}.pdf"):
                if self.app.builder.format == "html":
                    xref.replace_self(nodes.reference("", "", *xref.children, refuri=xref["reftarget"]))
                else:
                    xref.replace_self(nodes.inline("", "", *xref.children))


def fit_tables(app, doctree, docname) -> None:
    """doctree-resolved, in a LaTeX build: every table fitted (fit_table), the provenance page's too, which
    provenance.py fills at this event."""
    if app.builder.format == "latex":
        for table in list(doctree.findall(nodes.table)):
            fit_table(table)


def setup(app) -> None:
    app.connect("config-inited", latex_settings)
    app.connect("doctree-resolved", fit_tables, priority=900)  # after provenance.py's fill_table (500)
    app.add_post_transform(BookAsLatex)
    app.add_post_transform(LinkToThePdf)


# ---- the .tex as Sphinx wrote it ----

def hang_code_lines(tex: str, columns: int = 80) -> str:
    """Each line of code or output that may wrap (longer than `columns` in the .tex) starts with
    the macro hang_macro names for its indent: its continuation lines hang at that indent plus 4."""
    out, inside = [], False
    for line in tex.split("\n"):
        if line.startswith("\\begin{sphinxVerbatim}[commandchars="):
            inside = True
        elif line.startswith("\\end{sphinxVerbatim}"):
            inside = False
        elif inside and len(line) > columns:
            m = re.match(r"( *)(?:\\PYG\{\+w\}\{( +)\})?", line)
            line = "\\%s{}" % hang_macro(len(m.group(1)) + len(m.group(2) or "")) + line  # {} ends the name
        out.append(line)
    return "\n".join(out)


# ---- what the LaTeX log says ----

# Code and outputs are set in the mono fonts at \footnotesize (8 pt in a 10 pt book); prose, tables and
# inline code are at 10 pt. An overfull box set in them is a line of code or output past the margin.
VERBATIM_FONT = re.compile(r"\\TU/(%s)\(\d+\)/[^/\s]+/[^/\s]+/8 " % "|".join(
    f.replace(" ", "") for f in (LATIN_FONTS["mono"], CJK_FONTS["mono"])))
OVERFULL_VERBATIM_ALLOWED = 0


def overfull_verbatim(log: str) -> list[str]:
    """LaTeX's overfull-hbox warnings for lines of code or output, each with the line it shows."""
    return [f"{warning} {shown}" for warning, shown in re.findall(r"^(Overfull \\hbox .*)\n(.*)", log, re.M)
            if VERBATIM_FONT.search(shown)]


def overfull_tables(log: str, tex: str) -> list[str]:
    """LaTeX's overfull-box warnings from inside a table of the .tex (tabular, tabulary, longtable): a cell
    whose text is wider than its column runs under the next one, which hides it."""
    spans, start = [], None
    for number, line in enumerate(tex.split("\n"), start=1):
        if re.match(r"\\begin\{(tabular|tabulary|longtable)\}", line):
            start = number
        elif start and re.match(r"\\end\{(tabular|tabulary|longtable)\}", line):
            spans.append((start, number))
            start = None
    return [warning for warning, first, last in
            re.findall(r"^(Overfull \\hbox .* at lines (\d+)--(\d+))$", log, re.M)
            if any(a <= int(first) and int(last) <= b for a, b in spans)]


# ---- the command ----

def not_in_cache(store) -> list[Path]:
    """The chapters whose outputs the build would have to execute: those without an execution in the
    cache for their code cells as the build reads them (how provenance.py finds them too)."""
    from .cache import as_the_build_reads
    missing = []
    for md in book.chapters():
        try:
            hit = store.match_cache_notebook(as_the_build_reads(md))
        except KeyError:
            hit = None
        if hit is None:
            missing.append(md)
    return missing


def beside_pages(pdf_file: Path, html: Path = BUILD / "html") -> None:
    """Copy the PDF beside the built pages, where the front page's 下载 PDF links it (../NAME.pdf from
    chapters/), so that the link works in a locally built book as on the published site."""
    if html.is_dir():
        partial = html / f"{pdf_file.name}.partial"
        shutil.copyfile(pdf_file, partial)
        partial.replace(html / pdf_file.name)


def main(argv=None) -> int:
    ap = book.script_arguments().Parser(prog="python -m bookbuild.pdf",
                                        description=f"Build the book as a PDF, {OUT.relative_to(book.REPO)}.")
    ap.parse_args(argv)
    package = missing_package()
    if package:
        book.script_arguments().refuse(f"the PDF needs the Debian package {package}: "
                                       f"sudo apt-get install {' '.join(DEBIAN)}")
    book.warm_font_cache()
    t0 = time.perf_counter()
    keys = page_keys()
    uncached = not_in_cache(execution_cache(keys))
    if uncached:
        print(f"not in the execution cache, so executed now: {', '.join(md.name for md in uncached)}", flush=True)
    cmd = [str(Path(sys.executable).parent / "jupyter-book"), "build", str(book.REPO), "--builder", "latex"]
    rc = run_jupyter_book(cmd, keys)
    if rc:
        return rc
    tex = LATEX / f"{NAME}.tex"
    tex.write_text(hang_code_lines(tex.read_text(encoding="utf-8")), encoding="utf-8")
    log = LATEX / f"{NAME}.log"
    rc = subprocess.run(["latexmk", "-xelatex", "-interaction=nonstopmode", "-halt-on-error", f"{NAME}.tex"],
                        cwd=LATEX, capture_output=True).returncode  # Sphinx's latexmkrc is noisy on stderr
    if rc:
        print(f"xelatex failed: see {log.relative_to(book.REPO)}")
        return rc
    OUT.parent.mkdir(parents=True, exist_ok=True)
    partial = OUT.with_suffix(".pdf.partial")
    shutil.copyfile(LATEX / f"{NAME}.pdf", partial)
    partial.replace(OUT)  # a reader or the Pages upload never sees half a PDF
    beside_pages(OUT)
    overfull = overfull_verbatim(log.read_text(encoding="utf-8", errors="replace"))
    print(f"wrote {OUT.relative_to(book.REPO)} ({OUT.stat().st_size / 1e6:.1f} MB) in "
          f"{time.perf_counter() - t0:.0f} s; lines of code or output past the margin: {len(overfull)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

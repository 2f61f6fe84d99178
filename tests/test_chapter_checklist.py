"""A new chapter's author touches the chapter's .md and _toc.yml, and nothing else by hand.

The rest is derived from _toc.yml (bookbuild/book.py: the build, the refresh, the browser tests), or
checked here, with a message saying exactly what to add where. A long chapter is split into section pages
(NN_M_name.md, listed under the chapter's `sections:` in _toc.yml), each a notebook that runs on its own;
"chapter" below means either. Every chapter after the front page:
- starts with the hidden setup cell (its text is bookbuild.book.setup_cell_source());
- has a row in the front page's table of chapters that links to it (a section page: its chapter has);
- has a paired .ipynb with reference outputs (python -m bookbuild.refresh NN_name.md);
- has its own section in tests/nbval_sanitize.cfg, even if it is empty;
- has a file name that starts with its number, its place in _toc.yml (bookbuild.book.chapter_number),
  and a section page's with NN_M_ (bookbuild.book.section_number);
- tags each cell that needs CUDA with all of bookbuild.cuda.TAGS, in its .md and its .ipynb.
Every page has a title (its first `# ` heading, bookbuild.book.title). A page whose file name does not
start with a chapter number (chapters/glossary.md) is a plain page:
Markdown without code, after the last chapter in _toc.yml, with a row in the front page's table.
"""
import json
import os
import re

import jupytext
import nbformat
import pytest

from bookbuild import book, cuda

CHAPTERS = book.chapters()
PLAIN_PAGES = [md for md in book.pages()[1:] if md not in CHAPTERS]


def rel(path):
    return path.relative_to(book.REPO).as_posix()


def test_the_toc_lists_chapters_that_exist():
    missing = [rel(md) for md in book.pages() if not md.is_file()]
    assert book.front().is_file() and CHAPTERS, "_toc.yml should list the front page and the chapters"
    assert not missing, f"_toc.yml lists pages that have no .md file: {missing}"


@pytest.mark.parametrize("md", CHAPTERS, ids=lambda p: p.name)
def test_chapter_is_a_notebook_starting_with_the_setup_cell(md):
    text = md.read_text(encoding="utf-8")
    first = CHAPTERS[0] if CHAPTERS[0] != md else None
    assert text.startswith("---\n") and "jupytext:" in text[:400], (
        f"{rel(md)} must start with jupytext's front matter (a MyST notebook)"
        + (f": copy the block between the first two '---' lines of {rel(first)}" if first else ""))
    code = [c for c in jupytext.read(md).cells if c.cell_type == "code"]
    paste = f"Paste this below the chapter's title in {rel(md)}:\n\n{book.setup_cell_myst()}"
    assert code, f"{rel(md)} has no code cell. {paste}"
    setup = code[0]
    assert setup.source == book.setup_cell_source() and setup.metadata.get("tags") == book.SETUP_TAGS, (
        f"the first code cell of {rel(md)} is not the book's hidden setup cell "
        f"(bookbuild/book.py: setup_cell_source). {paste}")


def front_links():
    """The link targets of the front page's table rows, in order."""
    rows = [line for line in book.front().read_text(encoding="utf-8").splitlines() if line.startswith("|")]
    return [m.group(1) for row in rows for m in [re.search(r"\]\(([^)\s]+)\)", row)] if m]


@pytest.mark.parametrize("md", book.chapter_pages() + PLAIN_PAGES, ids=lambda p: p.name)
def test_front_page_table_links_to_the_chapter(md):
    link = os.path.relpath(md, book.front().parent).replace(os.sep, "/")
    assert link in front_links(), (
        f"the table of chapters in {rel(book.front())} has no row for {rel(md)}; add one, in _toc.yml's "
        f"order:\n| [{book.title(md)}]({link}) | <what the chapter covers> |")


def test_front_page_table_follows_the_toc():
    links = [os.path.relpath(md, book.front().parent).replace(os.sep, "/") for md in book.pages()[1:]]
    listed = [link for link in front_links() if link in links]
    assert listed == [link for link in links if link in listed], \
        f"the rows of the table in {rel(book.front())} should follow _toc.yml's order: {links}"


@pytest.mark.parametrize("md", PLAIN_PAGES, ids=lambda p: p.name)
def test_plain_page_is_markdown_after_the_chapters(md):
    text = md.read_text(encoding="utf-8")
    assert "```{code-cell}" not in text and "jupytext:" not in text[:400], (
        f"{rel(md)} has code cells or notebook front matter, but its name has no chapter number: "
        "a chapter's file is named NN_name.md; a plain page (like the glossary) has no code")
    assert book.pages()[1:].index(md) > book.pages()[1:].index(CHAPTERS[-1]), (
        f"list {rel(md)} after the last chapter in _toc.yml: chapter numbers count the pages before them")


@pytest.mark.parametrize("md", book.pages(), ids=lambda p: p.name)
def test_page_has_a_title(md):
    assert book.title(md)  # raises, saying what to add, when there is none


@pytest.mark.parametrize("md", CHAPTERS, ids=lambda p: p.name)
def test_chapter_file_name_starts_with_its_number(md):
    prefix = book.expected_name_prefix(md)
    kind = f"section {book.section_number(md)} of chapter" if book.section_number(md) else "chapter"
    assert md.name.startswith(prefix), (
        f"{rel(md)} is {kind} {book.chapter_number(md)} in _toc.yml: name it {prefix}<name>.md "
        "(or move it in _toc.yml)")


@pytest.mark.parametrize("md", CHAPTERS, ids=lambda p: p.name)
def test_cuda_cells_carry_the_tags_that_keep_them_off_a_cpu(md):
    ipynb = md.with_suffix(".ipynb")
    notebooks = [(rel(md), jupytext.read(md))] + ([(rel(ipynb), nbformat.read(ipynb, as_version=4))]
                                                   if ipynb.is_file() else [])
    for name, nb in notebooks:
        for cell in nb.cells:
            tags = cell.metadata.get("tags", [])
            missing = [t for t in cuda.TAGS if t not in tags]
            assert not cuda.is_cuda_cell(cell) or not missing, (
                f"a cell of {name} is tagged `cuda` but lacks {missing}: tag it [{', '.join(cuda.TAGS)}], so that "
                f"neither the build, the refresh nor nbval runs it on a machine without a GPU:\n{cell.source[:200]}")


@pytest.mark.parametrize("md", CHAPTERS, ids=lambda p: p.name)
def test_chapter_has_a_paired_ipynb(md):
    assert md.with_suffix(".ipynb").is_file(), (
        f"{rel(md)} has no paired {md.with_suffix('.ipynb').name} with reference outputs; make it with\n"
        f"    .venv/bin/python -m bookbuild.refresh {md.name}")


@pytest.mark.parametrize("md", CHAPTERS, ids=lambda p: p.name)
def test_chapter_has_a_sanitizer_section(md):
    header = book.sanitizer_header(md)
    lines = book.SANITIZER.read_text(encoding="utf-8").splitlines()
    assert header in lines, (
        f"{rel(book.SANITIZER)} has no section for {rel(md)}; add the line\n{header}\n"
        f"after the section of the chapter before it (the chapter's own nbval masks, if any, go below it)")


# ---- glue keys: one namespace per chapter ----
# A value glued in chapter N is named chN_...: the keys of all chapters share one namespace in the
# built book, and the prefix says at a glance which chapter a {glue:text}`key` in the prose comes from.

GLUE_FUNCTIONS = ("glue", "glue_measured")
GLUE_ROLE = re.compile(r"\{glue(?::\w+)?\}`([^`:]+)")  # {glue:text}`key:,` -> key


def glue_values_keys(md, source, node):
    """The keys of a measure.glue_values call: its literal prefix joined to each literal key of its dict and
    each keyword name; a computed key (a `**{f"..."}` spread, an f-string) becomes `.+` after the prefix."""
    import ast
    line = ast.get_source_segment(source, node).splitlines()[0]
    if not node.args or not (isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
        pytest.fail(f"{rel(md)}: the prefix of `{line}` is not a string literal")
    prefix = node.args[0].value
    names = [kw.arg for kw in node.keywords]  # None: a **{...} spread
    if len(node.args) > 1 and isinstance(node.args[1], ast.Dict):
        names += [k.value if isinstance(k, ast.Constant) else None for k in node.args[1].keys]
    return [(re.escape(prefix) + (re.escape(n) if n is not None else ".+"), prefix, line) for n in names]


def glue_keys(md):
    """The keys the chapter's code cells glue, as regexes: a string literal as itself, an f-string or a
    literal + expression with `.+` for the computed part. Returns [(regex, literal prefix, line)]."""
    import ast
    keys = []
    for cell in jupytext.read(md).cells:
        if cell.cell_type != "code":
            continue
        for node in ast.walk(ast.parse(cell.source)):
            func = getattr(node, "func", None)
            name = getattr(func, "id", None) or getattr(func, "attr", None)
            if isinstance(node, ast.Call) and name == "glue_values":  # measure.glue_values(prefix, {...}, **named)
                keys += glue_values_keys(md, cell.source, node)
                continue
            if isinstance(node, ast.Call) and name == "estimate_run_time":  # measure.py glues chN_run_estimate
                keys.append((f"ch{book.chapter_number(md)}_run_estimate", f"ch{book.chapter_number(md)}_", "estimate"))
                continue
            if not isinstance(node, ast.Call) or name not in GLUE_FUNCTIONS or not node.args:
                continue
            arg, line = node.args[0], ast.get_source_segment(cell.source, node).splitlines()[0]
            if isinstance(arg, ast.BinOp) and isinstance(arg.op, ast.Add):
                parts = [arg.left, None]
            elif isinstance(arg, ast.JoinedStr):
                parts = [v if isinstance(v, ast.Constant) else None for v in arg.values]
            else:
                parts = [arg]
            if not all(p is None or isinstance(p, ast.Constant) and isinstance(p.value, str) for p in parts):
                pytest.fail(f"{rel(md)}: the key of `{line}` is not a string, an f-string or \"literal\" + ...")
            prefix = parts[0].value if parts[0] is not None else ""
            keys.append(("".join(".+" if p is None else re.escape(p.value) for p in parts), prefix, line))
    return keys


@pytest.mark.parametrize("md", CHAPTERS, ids=lambda p: p.name)
def test_glue_keys_carry_the_chapter_prefix(md):
    prefix = f"ch{book.chapter_number(md)}_"
    wrong = [line for _, start, line in glue_keys(md) if not start.startswith(prefix)]
    assert not wrong, f"{rel(md)}: glue keys must start with {prefix!r} (the chapter's number): {wrong}"


@pytest.mark.parametrize("md", CHAPTERS, ids=lambda p: p.name)
def test_glue_references_name_keys_the_chapter_defines(md):
    keys = [key for key, _, _ in glue_keys(md)]
    prose = "\n".join(c.source for c in jupytext.read(md).cells if c.cell_type == "markdown")
    unknown = sorted({ref for ref in GLUE_ROLE.findall(prose) if not any(re.fullmatch(k, ref) for k in keys)})
    assert not unknown, f"{rel(md)}: the prose refers to glue keys that no code cell of the chapter glues: {unknown}"


@pytest.mark.parametrize("md", CHAPTERS, ids=lambda p: p.name)
def test_chapter_says_up_front_how_long_it_runs(md):
    """Before its first section, a chapter glues an estimate of its own run time from a calibration of a
    second or two (measure.estimate_run_time, scaled from chapters/run_times.json); chapter 1 times its
    own training steps instead (ch1_est_s)."""
    n = book.chapter_number(md)
    text = md.read_text(encoding="utf-8")
    intro = text[:text.index("\n## ")]
    if n == 1:
        assert "{glue:text}`ch1_est_s`" in intro, f"{rel(md)} no longer says before its first section how long it runs"
        return
    code = [c.source for c in jupytext.read(md).cells if c.cell_type == "code"]
    call = f'estimate_run_time("{md.stem}")'
    assert any(call in src for src in code[:3]), (
        f"{rel(md)}: one of its first cells should call {call} (code/measure.py), after the setup cell")
    assert f"{{glue:text}}`ch{n}_run_estimate`" in intro, (
        f"{rel(md)}: say before the first section how long the chapter runs: {{glue:text}}`ch{n}_run_estimate`")
    stored = json.loads((book.REPO / "chapters" / "run_times.json").read_text(encoding="utf-8"))
    assert md.stem in stored, f"{md.stem} has no stored run time: python -m bookbuild.refresh {md.name} records one"


# ---- pages a learner can follow: one idea a page, cells short enough to read ----
MAX_PAGE_LINES = 500  # a page's .md source; a longer chapter splits into section pages (NN_M_name.md)
MAX_VISIBLE_CELL_LINES = 25  # what a reader meets in the page; a helper they need not read is hidden or in code/
HIDDEN_TAGS = {"hide-input", "remove-cell", "remove-input"}


@pytest.mark.parametrize("md", CHAPTERS, ids=lambda p: p.name)
def test_a_page_holds_at_most_500_lines(md):
    lines = md.read_text(encoding="utf-8").count("\n")
    assert lines <= MAX_PAGE_LINES, (
        f"{rel(md)} has {lines} lines of source: split the chapter where its ideas split into section pages "
        f"(NN_M_name.md under the chapter's `sections:` in _toc.yml), each at most {MAX_PAGE_LINES} lines")


@pytest.mark.parametrize("md", CHAPTERS, ids=lambda p: p.name)
def test_visible_code_cells_are_short(md):
    long = [(i, len(c.source.splitlines())) for i, c in enumerate(jupytext.read(md).cells)
            if c.cell_type == "code" and not HIDDEN_TAGS & set(c.metadata.get("tags", []))
            and len(c.source.splitlines()) > MAX_VISIBLE_CELL_LINES]
    assert not long, (
        f"{rel(md)}: visible code cells over {MAX_VISIBLE_CELL_LINES} lines (cell index, lines): {long}; split "
        "them where the ideas split, or hide what the reader need not read (tag hide-input and say what it does)")

"""The book as _toc.yml and _config.yml describe it, and what every chapter must carry.

A new chapter's author writes its .md and lists it in _toc.yml; tests/test_chapter_checklist.py then
says what else the chapter needs: the hidden setup cell below, a row in the front page's table, a
paired .ipynb (`python -m bookbuild.refresh NN_name.md`) and a section in the nbval sanitizer.
"""
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
TOC = REPO / "_toc.yml"
CONFIG = REPO / "_config.yml"
SANITIZER = REPO / "tests" / "nbval_sanitize.cfg"


def _files(entries):
    for entry in entries or []:
        if "file" in entry:
            yield entry["file"]
        yield from _files(entry.get("sections"))


def pages() -> list[Path]:
    """Every page of _toc.yml in reading order, as the path of its .md file: the front page first."""
    toc = yaml.safe_load(TOC.read_text(encoding="utf-8"))
    parts = toc.get("parts") or [{"chapters": toc.get("chapters")}]
    names = [toc["root"], *(f for part in parts for f in _files(part.get("chapters")))]
    return [REPO / (name if name.endswith(".md") else f"{name}.md") for name in names]


def front() -> Path:
    return pages()[0]


def _is_notebook_page(path: Path) -> bool:
    return path.name[:2].isdigit() and path.name[2:3] == "_"


def chapters() -> list[Path]:
    """Every page that is a notebook, in reading order: each chapter's own page (NN_name.md) followed by
    its section pages (NN_M_name.md, listed under the chapter's `sections:` in _toc.yml), each a jupytext
    notebook with a paired .ipynb that runs on its own. Other pages (the glossary) are plain Markdown."""
    return [p for p in pages()[1:] if _is_notebook_page(p)]


def _chapter_entries() -> list[tuple[Path, list[Path]]]:
    """(chapter page, its section pages) for each chapter of _toc.yml, in order."""
    toc = yaml.safe_load(TOC.read_text(encoding="utf-8"))
    parts = toc.get("parts") or [{"chapters": toc.get("chapters")}]
    out = []
    for part in parts:
        for entry in part.get("chapters") or []:
            page = REPO / f"{entry['file']}.md" if "file" in entry else None
            if page is not None and _is_notebook_page(page):
                secs = [REPO / (f if f.endswith(".md") else f"{f}.md") for f in _files(entry.get("sections"))]
                out.append((page, secs))
    return out


def chapter_pages() -> list[Path]:
    """Each chapter's own page (the first of its pages), in order: the pages the front page's table lists."""
    return [page for page, _ in _chapter_entries()]


def sections(md: Path) -> list[Path]:
    """The section pages of the chapter whose own page is md (none for most chapters)."""
    return next((secs for page, secs in _chapter_entries() if page == md), [])


def title(md: Path) -> str:
    """A page's title: its first level-1 heading, outside front matter and code."""
    from markdown_it import MarkdownIt
    from mdit_py_plugins.front_matter import front_matter_plugin
    tokens = MarkdownIt("commonmark").use(front_matter_plugin).parse(md.read_text(encoding="utf-8"))
    for token, content in zip(tokens, tokens[1:]):
        if token.type == "heading_open" and token.tag == "h1" and token.level == 0:
            return content.content.strip()
    raise ValueError(f"{md.name} has no title: its first heading should be `# <title>`")


def docname(md: Path) -> str:
    """The page's name in the built book: chapters/01_data_model.md -> chapters/01_data_model."""
    return md.relative_to(REPO).with_suffix("").as_posix()


def chapter_number(md: Path) -> int:
    """The number of the chapter a page belongs to: its chapter's place in _toc.yml after the front page
    (chapter 1 is the first). Its file name starts with the same number (tests/test_chapter_checklist.py
    checks it)."""
    for n, (page, secs) in enumerate(_chapter_entries(), start=1):
        if md == page or md in secs:
            return n
    raise ValueError(f"{md.name} is not a chapter or a section of one in _toc.yml")


def section_number(md: Path) -> int:
    """0 for a chapter's own page, M for the M-th section page under it in _toc.yml (named NN_M_name.md)."""
    for page, secs in _chapter_entries():
        if md == page:
            return 0
        if md in secs:
            return secs.index(md) + 1
    raise ValueError(f"{md.name} is not a chapter or a section of one in _toc.yml")


def expected_name_prefix(md: Path) -> str:
    """What a notebook page's file name starts with: NN_ for a chapter, NN_M_ for its M-th section."""
    n, m = chapter_number(md), section_number(md)
    return f"{n:02d}_" + (f"{m}_" if m else "")


def sanitizer_header(md: Path) -> str:
    """The line that opens a page's own section in tests/nbval_sanitize.cfg (chapter 9, or 9.2 for its
    second section page)."""
    m = section_number(md)
    return f"# ---- chapter {chapter_number(md)}{f'.{m}' if m else ''} ----"


def script_arguments():
    """code/arguments.py, the scripts' one way to take arguments and refuse (a bad argument is one line
    on stderr and exit 2, any other refusal exit 1), for bookbuild's commands too."""
    if str(REPO / "code") not in sys.path:
        sys.path.insert(0, str(REPO / "code"))
    import arguments
    return arguments


def repository_url() -> str:
    return yaml.safe_load(CONFIG.read_text(encoding="utf-8"))["repository"]["url"]


SETUP_TAGS = ["remove-cell"]
_SETUP = '''# Setup (hidden on the page): put the book's code/ on the path. In a clone the chapter runs in
# chapters/ beside code/; opened on its own (Colab, Binder) it first fetches the book and installs
# what the chapters import.
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

BOOK_REPO = "<repository.url>"  # = repository.url in _config.yml
if not (Path.cwd().parent / "code" / "model.py").is_file():
    if not Path("train-faster-larger").is_dir():
        subprocess.run(["git", "clone", "--depth", "1", BOOK_REPO, "train-faster-larger"], check=True)
    os.chdir(Path("train-faster-larger") / "chapters")
    wanted = ("torch", "numpy", "sentencepiece", "matplotlib", "myst-nb")
    pins = [line for line in Path("../requirements.txt").read_text().split()
            if line.split("==")[0] in wanted and not (line.startswith("torch==") and importlib.util.find_spec("torch"))]
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", *pins], check=True)
sys.path.insert(0, str(Path.cwd().parent / "code"))'''


def setup_cell_source() -> str:
    """The source of the hidden setup cell that every chapter starts with (its first code cell)."""
    return _SETUP.replace("<repository.url>", repository_url())


def setup_cell_myst() -> str:
    """The setup cell as it is written in a chapter's .md, to paste below the chapter's title."""
    return f"```{{code-cell}} ipython3\n:tags: [{', '.join(SETUP_TAGS)}]\n\n{setup_cell_source()}\n```\n"


def warm_font_cache() -> None:
    """Build matplotlib's font cache before a chapter runs: on a fresh machine the first import prints
    "Matplotlib is building the font cache" on stderr, which would land in a chapter's outputs."""
    import matplotlib.font_manager  # noqa: F401

"""Which tests are slow, decided here, and the fixtures the tests of the built book share.

`python -m pytest -m "not slow"` is the fast path (the unit tests of code/ and bookbuild/, under two
minutes on two cores); `python -m pytest` runs everything.

Slow: every nbval item (each re-executes a chapter's cell), every test that takes the built book (the
fixtures below: the first one builds the book, which executes only chapters nbval has not handed to the
execution cache), the tests of the modules below, which drive headless Chromium, build a book or start
processes that import torch and train, and each test marked `@pytest.mark.slow` in a module that is
otherwise fast (test_train_gpu.py and test_launch.py mark every test that starts a process; their
in-process refusals, --help and init tests stay on the fast path, and no fast test starts torchrun).

The built book, once per session: `book_build` is one strict build of the current sources
(`python -m bookbuild.build --strict`, which decides what to re-read and re-execute), `site` serves it on
127.0.0.1 and `browser` is one headless Chromium, shared by test_browser.py, test_pages.py,
test_calculator.py, test_search_terms.py and test_pdf.py (the PDF is built from that HTML). The tests
that take them run after the other tests of tests/ (and so after nbval over the chapters, which fills
the build's execution cache), one module after another, so the browser's event loop lives only while
they run.
"""
import functools
import http.server
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from bookbuild import book

REPO = Path(__file__).resolve().parent.parent
HTML = REPO / "_build" / "html"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
NO_CHROMIUM = "no chromium on this machine (apt-get install chromium)"
BOOK_FIXTURES = {"book_build", "site", "browser"}

SLOW_MODULES = {
    "test_browser": "drives headless Chromium over the built book (builds it first)",
    "test_calculator": "drives headless Chromium over chapter 12's calculator",
    "test_search_index": "builds a two-page book",
    "test_ddp": "starts two processes with torch.distributed.run",
    "test_slurm": "starts a two-node Slurm cluster and trains through launch/slurm.sbatch",
    "test_pdf": "builds the PDF with xelatex (and the book first, if no build has these inputs)",
}

if not CHROMIUM and os.environ.get("CI") == "true":
    raise RuntimeError("CI needs Debian's chromium for the browser tests: apt-get install chromium")


def pytest_configure(config):
    missing = [name for name in SLOW_MODULES if not (Path(__file__).parent / f"{name}.py").is_file()]
    if missing:
        raise pytest.UsageError(f"tests/conftest.py: SLOW_MODULES names tests that do not exist: {missing}")


def uses_the_book(item) -> bool:
    """Whether the test takes the built book: one of the fixtures below, or the PDF's (test_pdf.built,
    which takes book_build unless the HTML of these inputs is there already)."""
    module = getattr(item, "module", None)
    return bool(BOOK_FIXTURES & set(getattr(item, "fixturenames", ()))) or (
        module is not None and module.__name__.rpartition(".")[2] == "test_pdf")


def is_slow(item) -> bool:
    if getattr(item, "cell", None) is not None:  # nbval's item: one cell of a chapter
        return True
    if uses_the_book(item):
        return True
    module = getattr(item, "module", None)
    return module is not None and module.__name__.rpartition(".")[2] in SLOW_MODULES


def pytest_collection_modifyitems(config, items):
    for item in items:
        if is_slow(item):
            item.add_marker(pytest.mark.slow)
    # the chapters in the book's order (chapter 9's first page runs the experiment its sections read), then
    # the tests of the built book last (stable: each module's tests stay together and in order), so that
    # one build follows every chapter nbval ran, and one browser serves them all
    order = {md.with_suffix(".ipynb"): i for i, md in enumerate(book.pages())}
    items.sort(key=lambda item: (uses_the_book(item), order.get(Path(str(item.fspath)), len(order))))


# A page is ready once it has loaded (scripts, styles, images), MathJax has typeset it and its fonts are in.
# Playwright's "networkidle" waited for the same plus 500 ms without a request, on each of about 150 page
# loads of the tests of the built book: over a minute of waiting for nothing.
READY_JS = """async () => {
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) await MathJax.startup.promise;
  await document.fonts.ready;
}"""


def goto_ready(page, url):
    """Open url in page and wait until it is ready to be measured (READY_JS)."""
    page.goto(url, wait_until="load")
    page.evaluate(READY_JS)


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # one line per request would bury the test output
        pass


@pytest.fixture(scope="session")
def book_build():
    """_build/html, from one strict build of the current sources in this session (re-executing only what
    the execution cache does not hold)."""
    build = subprocess.run([sys.executable, "-m", "bookbuild.build", "--strict"], cwd=REPO)
    assert build.returncode == 0, "the strict book build failed"
    return HTML


@pytest.fixture(scope="session")
def site(request):
    """The session's strict build, served on 127.0.0.1."""
    if not CHROMIUM:  # the book is built only where its pages can be opened
        pytest.skip(NO_CHROMIUM)
    html = request.getfixturevalue("book_build")
    handler = functools.partial(QuietHandler, directory=str(html))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.fixture(scope="session")
def browser():
    """One headless Chromium for the session; each test opens its own pages or contexts."""
    if not CHROMIUM:
        pytest.skip(NO_CHROMIUM)
    playwright = pytest.importorskip("playwright.sync_api")
    with playwright.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync"])
        yield b
        b.close()

"""pytest hooks for nbval over the chapters; chapters/conftest.py imports them.

- Cells tagged `cuda` carry nbval's own `nbval-skip` tag, so nbval skips them (cuda.py).
- Each chapter's kernel is traced (reads.py): when every cell has run, a code/ file the chapter loaded
  outside its key fails its last cell, naming the file.
- A chapter whose every cell ran and matched its reference outputs is handed to the book's execution
  cache with the outputs nbval just produced (cache.py), so a book build after the tests publishes
  exactly those checked outputs instead of executing every chapter a second time; and its pass is noted.
- With BOOK_NBVAL_CHANGED_ONLY=1, a chapter whose nbval_key (its page key, .ipynb and the sanitizer) is
  that of a noted pass is not collected: a developer's re-run checks only what a change can affect.
"""
import os
import time
from pathlib import Path

import pytest

from . import cache, reads
from .book import warm_font_cache
from .cuda import is_cuda_cell

warm_font_cache()  # before any chapter's kernel starts: its first output must not be matplotlib's notice

CHANGED_ONLY_VAR = "BOOK_NBVAL_CHANGED_ONLY"
_runs = {}  # notebook path -> what happened to its cells in this session


def is_the_books_run() -> bool:
    """Whether this run's outputs may be published: not under capped kernels (code/record.py's
    EMULATION_VARS, as CI's emulated run sets them) nor in a portability run."""
    from record import EMULATION_VARS  # code/ is on pytest's path (pyproject.toml); torch-free
    return not os.environ.get("BOOK_NO_CACHE_HANDOFF") and not any(os.environ.get(v) for v in EMULATION_VARS)


def _page(item) -> Path | None:
    """The chapter .md of an nbval item, or None (not a cell of a chapter with a .md)."""
    if getattr(item, "cell", None) is None:
        return None
    md = Path(str(item.fspath)).with_suffix(".md")
    return md if md.is_file() else None


def pytest_collection_modifyitems(session, config, items):
    if os.environ.get(CHANGED_ONLY_VAR) != "1" or not is_the_books_run():
        return
    verdict = {}
    for item in items:
        md = _page(item)
        if md is not None and md not in verdict:
            verdict[md] = cache.nbval_passed(md)
    unchanged = [item for item in items if verdict.get(_page(item))]
    if unchanged:
        items[:] = [item for item in items if not verdict.get(_page(item))]
        config.hook.pytest_deselected(items=unchanged)
    skipped = sorted(md.stem for md, same in verdict.items() if same)
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(f"{CHANGED_ONLY_VAR}=1: {len(skipped)} of {len(verdict)} chapters unchanged since a run "
                            f"that passed, not run{': ' if skipped else ''}{' '.join(skipped)}")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    """The chapter's first cell starts its kernel (nbval's setup of the notebook): trace it."""
    md = _page(item)
    if md is None or getattr(item.parent, "kernel", None) is not None:
        yield
        return
    with reads.Traced(cache.READS / f"{md.stem}.log"):
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    report = (yield).get_result()
    cell = getattr(item, "cell", None)
    if cell is None:
        return
    path = Path(str(item.fspath))
    md = path.with_suffix(".md")
    run = _runs.get(path)
    if run is None:  # the chapter's first cell: note the inputs its outputs will come from
        run = _runs[path] = {"nb": item.parent.nb, "outputs": {}, "failed": False, "start": time.time(),
                             "key": cache.page_key(md) if md.is_file() else None}
    if report.failed:
        if not run["failed"] and md.is_file():
            cache.record_nbval(md, None)
        run["failed"] = True
    elif report.when == "call" and report.passed:
        run["outputs"][id(cell)] = item.test_outputs
    elif report.skipped and is_cuda_cell(cell):
        run["outputs"][id(cell)] = []  # what the build gives it too: no output
    n_code = sum(c.cell_type == "code" for c in run["nb"].cells)
    if not run.get("done") and not run["failed"] and len(run["outputs"]) == n_code and md.is_file():
        run["done"] = True  # the chapter's last cell: check what it loaded, then cache it, before the browser tests
        failure = reads.verdict(md, cache.READS / f"{md.stem}.log")
        if failure:
            run["failed"] = True
            report.outcome, report.longrepr = "failed", failure
            cache.record_nbval(md, None)
        else:
            _hand_to_the_build(md, run)


def _hand_to_the_build(md: Path, run) -> None:
    if not is_the_books_run() or cache.page_key(md) != run["key"]:
        return  # capped kernels, or code/ or the corpus changed while the chapter ran
    cache.record_nbval(md, cache.nbval_key(md))
    nb = cache.executed_notebook(run, cache.as_the_build_reads(md))
    if nb is not None:  # else not the cells the build reads
        cache.store(md, nb, run["key"], time.time() - run["start"])

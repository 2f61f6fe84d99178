"""pytest hooks for nbval over the chapters; chapters/conftest.py imports them.

- Cells tagged `cuda` carry nbval's own `nbval-skip` tag, so nbval skips them (cuda.py).
- A chapter whose every cell ran and matched its reference outputs is handed to the book's execution
  cache with the outputs nbval just produced (cache.py), so a book build after the tests publishes
  exactly those checked outputs instead of executing every chapter a second time.
"""
import os
import time
from pathlib import Path

import pytest

from . import cache
from .book import warm_font_cache
from .cuda import is_cuda_cell

warm_font_cache()  # before any chapter's kernel starts: its first output must not be matplotlib's notice

_runs = {}  # notebook path -> what happened to its cells in this session


def is_the_books_run() -> bool:
    """Whether this run's outputs may be published: not under capped kernels (code/record.py's
    EMULATION_VARS, as CI's emulated run sets them) nor in a portability run."""
    from record import EMULATION_VARS  # code/ is on pytest's path (pyproject.toml); torch-free
    return not os.environ.get("BOOK_NO_CACHE_HANDOFF") and not any(os.environ.get(v) for v in EMULATION_VARS)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    report = (yield).get_result()
    cell = getattr(item, "cell", None)
    if cell is None:
        return
    path = Path(str(item.fspath))
    run = _runs.get(path)
    if run is None:  # the chapter's first cell: note the inputs its outputs will come from
        run = _runs[path] = {"nb": item.parent.nb, "outputs": {}, "failed": False,
                             "start": time.time(), "inputs": cache.inputs_hash()}
    if report.failed:
        run["failed"] = True
    elif report.when == "call" and report.passed:
        run["outputs"][id(cell)] = item.test_outputs
    elif report.skipped and is_cuda_cell(cell):
        run["outputs"][id(cell)] = []  # what the build gives it too: no output
    n_code = sum(c.cell_type == "code" for c in run["nb"].cells)
    if not run.get("cached") and not run["failed"] and len(run["outputs"]) == n_code:
        run["cached"] = True  # the chapter's last cell: cache it now, before the browser tests build
        _hand_to_the_build(path, run)


def _hand_to_the_build(path: Path, run) -> None:
    md = path.with_suffix(".md")
    if not md.is_file() or not is_the_books_run():
        return
    nb = cache.executed_notebook(run, cache.as_the_build_reads(md))
    digest = cache.inputs_hash()
    if nb is None or digest != run["inputs"]:
        return  # not the cells the build reads, or code/ or the corpus changed while the chapter ran
    cache.store(md, nb, digest, time.time() - run["start"])

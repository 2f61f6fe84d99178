"""nbval over the chapters.

- Cells tagged `cuda` run only where CUDA exists; elsewhere they are skipped, not failed.
- A chapter whose every cell ran and matched its reference outputs is handed to the book's
  execution cache (_build/.jupyter_cache) with the outputs nbval just produced, so a book build
  after the tests publishes exactly those checked outputs instead of executing every chapter a
  second time. tests/build_book.py empties that cache whenever code/, the corpus, the
  requirements or _config.yml change, and a chapter whose code cells differ does not match it.
"""
import copy
import importlib.util
import time
from pathlib import Path

import pytest

# Build matplotlib's font cache now: on a fresh machine the first import prints "Matplotlib is
# building the font cache" on stderr, which nbval would compare against the stored outputs.
import matplotlib.font_manager  # noqa: E402,F401

REPO = Path(__file__).resolve().parent.parent


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


build_book = _load("build_book", REPO / "tests" / "build_book.py")
book_html = _load("book_html", REPO / "_ext" / "book_html.py")

_runs = {}  # notebook path -> what happened to its cells in this session


def pytest_collection_modifyitems(config, items):
    try:
        import torch
        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    if has_cuda:
        return
    skip = pytest.mark.skip(reason="cell tagged `cuda` and this machine has no CUDA")
    for item in items:
        cell = getattr(item, "cell", None)
        if cell is not None and "cuda" in cell.get("metadata", {}).get("tags", []):
            item.add_marker(skip)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    report = (yield).get_result()
    cell = getattr(item, "cell", None)
    if cell is None:
        return
    run = _runs.get(Path(str(item.fspath)))
    if run is None:  # the chapter's first cell: note the inputs its outputs will come from
        run = _runs[Path(str(item.fspath))] = {"nb": item.parent.nb, "outputs": {}, "failed": False,
                                               "start": time.time(), "inputs": build_book.inputs_hash()}
    if report.failed:
        run["failed"] = True
    elif report.when == "call" and report.passed:
        run["outputs"][id(cell)] = item.test_outputs
    elif report.skipped and "cuda" in cell.get("metadata", {}).get("tags", []):
        run["outputs"][id(cell)] = []  # what a build without CUDA shows for it: no output
    n_code = sum(c.cell_type == "code" for c in run["nb"].cells)
    if not run.get("cached") and not run["failed"] and len(run["outputs"]) == n_code:
        run["cached"] = True  # the chapter's last cell: cache it now, before the browser tests build
        _cache(Path(str(item.fspath)), run)


def as_the_build_reads(md: Path):
    """The notebook myst-nb makes of a chapter's .md in a build (after _ext/book_html.py's source-read
    hook): the execution cache matches on its code cells' source and metadata, so cache this one."""
    from myst_nb.core.read import read_myst_markdown_notebook
    source = [md.read_text(encoding="utf-8")]
    book_html.skip_cuda_cells_without_cuda(None, md.stem, source)
    return read_myst_markdown_notebook(source[0])


def _executed_notebook(run, nb):
    """`nb` (a chapter as the build reads it) with each code cell's outputs from this nbval run, or
    None when some cell failed or did not run, or the cells differ from the ones nbval ran."""
    nb = copy.deepcopy(nb)
    ran = [c for c in run["nb"].cells if c.cell_type == "code"]
    code = [c for c in nb.cells if c.cell_type == "code"]
    if run["failed"] or len(ran) != len(code):
        return None
    for count, (ref_cell, cell) in enumerate(zip(ran, code), start=1):
        if id(ref_cell) not in run["outputs"] or ref_cell.source != cell.source:
            return None
        cell.outputs = copy.deepcopy(run["outputs"][id(ref_cell)])
        cell.execution_count = count
        for out in cell.outputs:
            if out.get("output_type") == "execute_result":
                out["execution_count"] = count
    return nb


def _cache(path: Path, run) -> None:
    md = path.with_suffix(".md")
    if not md.is_file() or (nb := _executed_notebook(run, as_the_build_reads(md))) is None:
        return
    from jupyter_cache.base import CacheBundleIn

    digest = build_book.inputs_hash()
    if digest != run["inputs"]:
        return  # code/ or the corpus changed while the chapter ran: its outputs may be from either
    cache = build_book.execution_cache(digest)
    cache.cache_notebook_bundle(
        CacheBundleIn(nb, str(md), data={"execution_seconds": time.time() - run["start"], "executed_by": "nbval"}),
        check_validity=False, overwrite=True)

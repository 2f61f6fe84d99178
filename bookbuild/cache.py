"""The build's execution cache, and how a chapter that nbval ran gets into it.

Jupyter Book's cache keys a chapter on its own code cells only, so a change under code/ or data/ would
leave stale outputs. inputs_hash() covers those inputs, and execution_cache() empties the cache when
they changed since it was filled.

The tests fill the same cache: every chapter that nbval ran and found equal to its reference outputs is
stored with the outputs nbval produced (nbval_hooks.py), under the key the build looks it up by (the
chapter's code cells as the build reads them). So `pytest` followed by a build executes each
chapter once, and the book shows the very outputs the tests checked.
"""
import copy
import hashlib
import shutil
from pathlib import Path

from .book import REPO

BUILD = REPO / "_build"
STAMP = BUILD / ".inputs-hash"                # inputs of the last successful HTML build
CACHE = BUILD / ".jupyter_cache"               # Jupyter Book's execution cache (the default path)
CACHE_STAMP = BUILD / ".cache-inputs-hash"     # inputs the cached executions were made with


def inputs_hash() -> str:
    """What a chapter's outputs depend on besides its own cells."""
    h = hashlib.sha256()
    for path in sorted([*(REPO / "code").glob("*.py"), REPO / "data" / "songci.txt",
                        REPO / "requirements.txt", REPO / "_config.yml"]):
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def execution_cache(digest: str):
    """The book's jupyter-cache, emptied first if it was filled with other inputs."""
    from jupyter_cache import get_cache
    if not CACHE_STAMP.is_file() or CACHE_STAMP.read_text() != digest:
        shutil.rmtree(CACHE, ignore_errors=True)
        BUILD.mkdir(exist_ok=True)
        CACHE_STAMP.write_text(digest)
    return get_cache(str(CACHE))


def as_the_build_reads(md: Path):
    """The notebook myst-nb makes of a chapter's .md in a build: the execution cache matches on its
    code cells' source and metadata (the source-read hook adds Markdown only)."""
    from myst_nb.core.read import read_myst_markdown_notebook
    return read_myst_markdown_notebook(md.read_text(encoding="utf-8"))


def executed_notebook(run, nb):
    """`nb` (a chapter as the build reads it) with each code cell's outputs from an nbval run, or None
    when some cell failed or did not run, or the cells differ from the ones nbval ran. `run` holds the
    notebook nbval ran ("nb"), the outputs of each cell that passed by id(cell) ("outputs") and
    whether a cell failed ("failed")."""
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


def store(md: Path, nb, digest: str, seconds: float) -> None:
    """Put an executed chapter in the build's execution cache, filed under the chapter's .md."""
    from jupyter_cache.base import CacheBundleIn
    execution_cache(digest).cache_notebook_bundle(
        CacheBundleIn(nb, str(md), data={"execution_seconds": seconds, "executed_by": "nbval"}),
        check_validity=False, overwrite=True)

"""Each chapter's .md (the source) and .ipynb (the reference outputs nbval checks) hold the same cells."""
from pathlib import Path

import jupytext
import pytest

CHAPTERS = Path(__file__).resolve().parent.parent / "chapters"
NOTEBOOK_MDS = sorted(p for p in CHAPTERS.glob("*.md") if "jupytext:" in p.read_text(encoding="utf-8")[:400])


def cells(nb):
    return [(c.cell_type, c.source.strip(), sorted(c.metadata.get("tags", []))) for c in nb.cells]


def test_there_are_notebook_chapters():
    assert NOTEBOOK_MDS, "no jupytext chapters found"


@pytest.mark.parametrize("md", NOTEBOOK_MDS, ids=lambda p: p.name)
def test_md_and_ipynb_have_the_same_cells(md):
    ipynb = md.with_suffix(".ipynb")
    assert ipynb.is_file(), f"{md.name} has no paired {ipynb.name}; run python -m bookbuild.refresh {md.name}"
    a, b = cells(jupytext.read(md)), cells(jupytext.read(ipynb))
    for i, (ca, cb) in enumerate(zip(a, b)):
        assert ca == cb, (f"cell {i} differs between {md.name} and {ipynb.name}; "
                          f"run python -m bookbuild.refresh {md.name}")
    assert len(a) == len(b), f"{md.name} has {len(a)} cells, {ipynb.name} has {len(b)}"


@pytest.mark.parametrize("md", NOTEBOOK_MDS, ids=lambda p: p.name)
def test_ipynb_holds_executed_outputs(md):
    nb = jupytext.read(md.with_suffix(".ipynb"))
    code = [c for c in nb.cells if c.cell_type == "code" and "cuda" not in c.metadata.get("tags", [])]
    assert code and all(c.execution_count is not None for c in code), \
        f"{md.with_suffix('.ipynb').name} has unexecuted cells; run python -m bookbuild.refresh {md.name}"
    counts = [c.execution_count for c in code]
    assert counts == sorted(counts), "cells were executed out of order"


@pytest.mark.parametrize("md", NOTEBOOK_MDS, ids=lambda p: p.name)
def test_stored_outputs_hold_nothing_that_changes_every_run(md):
    """An object's repr with its memory address, or an absolute path, can never match on a re-run."""
    import re
    nb = jupytext.read(md.with_suffix(".ipynb"))
    for i, cell in enumerate(nb.cells):
        for out in cell.get("outputs", []):
            text = out.get("text", "") + "".join(str(v) for k, v in out.get("data", {}).items() if k.startswith("text"))
            assert not re.search(r" at 0x[0-9a-f]{6,}", text), f"cell {i} of {md.name} prints a memory address"
            assert str(CHAPTERS.parent) not in text, f"cell {i} of {md.name} prints an absolute path"

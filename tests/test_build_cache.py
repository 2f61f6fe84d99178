"""How the book build avoids executing a chapter twice, and never executes a CUDA cell.

- nbval's outputs are stored in the book's execution cache under a key that the build finds from
  the chapter's .md (bookbuild/cache.py, bookbuild/nbval_hooks.py); a failed or partial run is not stored.
- A cell tagged `cuda` carries `skip-execution` and `nbval-skip` (bookbuild/cuda.py): the build's
  executor, the refresh and nbval each leave it unexecuted; only bookbuild.gpu_run runs it.
"""
import copy
import subprocess
import sys
from types import SimpleNamespace

import jupytext
import nbformat
import pytest
from jupyter_cache import get_cache
from jupyter_cache.base import CacheBundleIn
from myst_nb.core.config import NbParserConfig
from myst_nb.core.read import create_nb_reader, read_myst_markdown_notebook
from myst_parser.config.main import MdParserConfig

from bookbuild import cache, refresh, sphinx_ext
from bookbuild.book import REPO


def _run(nb, outputs, failed=False):
    return {"nb": nb, "outputs": outputs, "failed": failed, "start": 0.0, "inputs": ""}


# what the source-read hook uses of Sphinx's app: where a page's source file is
APP = SimpleNamespace(env=SimpleNamespace(doc2path=lambda docname: REPO / f"{docname}.md"))


@pytest.mark.parametrize("chapter", ["02_speed", "11_2_mfu"])
def test_the_build_finds_a_chapter_that_nbval_ran(tmp_path, chapter):
    ipynb = nbformat.read(REPO / "chapters" / f"{chapter}.ipynb", as_version=4)
    outputs = {id(c): c.outputs for c in ipynb.cells if c.cell_type == "code"}
    md_path = REPO / "chapters" / f"{chapter}.md"
    done = cache.executed_notebook(_run(ipynb, outputs), cache.as_the_build_reads(md_path))
    store = get_cache(str(tmp_path / "cache"))
    store.cache_notebook_bundle(CacheBundleIn(done, str(md_path)), check_validity=False, overwrite=True)
    # what myst-nb reads in a build: the page's source after the book's source-read hook
    source = [md_path.read_text(encoding="utf-8")]
    sphinx_ext.show_stored_gpu_outputs_as_read(APP, f"chapters/{chapter}", source)
    reader = create_nb_reader(str(md_path), MdParserConfig(), NbParserConfig(), source[0])
    assert store.match_cache_notebook(reader.read(source[0])) is not None
    edited = reader.read(source[0].replace("```{code-cell} ipython3\n", "```{code-cell} ipython3\n# edited\n", 2))
    with pytest.raises(KeyError):  # an edited chapter must not match
        store.match_cache_notebook(edited)


def test_only_a_complete_passing_nbval_run_becomes_an_executed_notebook():
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("text"),
        nbformat.v4.new_code_cell("print(1)"),
        nbformat.v4.new_code_cell("1 + 1"),
    ])
    out1 = [nbformat.v4.new_output("stream", name="stdout", text="1\n")]
    out2 = [nbformat.v4.new_output("execute_result", data={"text/plain": "2"}, execution_count=7)]
    full = {id(nb.cells[1]): out1, id(nb.cells[2]): out2}
    done = cache.executed_notebook(_run(nb, full), nb)
    assert done.cells[1].outputs == out1 and done.cells[2].outputs[0]["data"] == {"text/plain": "2"}
    assert [c.get("execution_count") for c in done.cells] == [None, 1, 2]
    assert done.cells[2].outputs[0]["execution_count"] == 2
    assert nb.cells[1].outputs == []  # the notebook passed in is left alone
    assert cache.executed_notebook(_run(nb, {id(nb.cells[1]): out1}), nb) is None  # a cell did not run
    assert cache.executed_notebook(_run(nb, copy.copy(full), failed=True), nb) is None
    other = copy.deepcopy(nb)
    other.cells[2].source = "2 + 2"
    assert cache.executed_notebook(_run(nb, full), other) is None  # not the cells nbval ran


# ---- the cuda rule: static tags that every executor honours ----

CUDA_CHAPTER = """\
---
jupytext:
  text_representation:
    extension: .md
    format_name: myst
    format_version: 0.13
kernelspec:
  display_name: Python 3
  language: python
  name: python3
---
# A chapter

```{code-cell} ipython3
print("a CPU cell ran")
```

```{code-cell} ipython3
:tags: [cuda, skip-execution, nbval-skip]
raise RuntimeError("a cuda cell ran")
```
"""


def outputs_of(nb):
    return ["".join(o.get("text", "") for o in c.outputs) for c in nb.cells if c.cell_type == "code"]


def test_the_build_does_not_execute_a_cuda_cell(tmp_path):
    """The notebook myst-nb reads, executed as the build's execution cache executes it."""
    from jupyter_cache.executors.utils import single_nb_execution
    nb = read_myst_markdown_notebook(CUDA_CHAPTER)
    result = single_nb_execution(nb, cwd=str(tmp_path), timeout=120, allow_errors=False)
    assert result.err is None and outputs_of(nb) == ["a CPU cell ran\n", ""]


def test_the_refresh_does_not_execute_a_cuda_cell_and_the_gpu_run_does(tmp_path):
    from nbclient.exceptions import CellExecutionError
    md = tmp_path / "09_x.md"
    md.write_text(CUDA_CHAPTER, encoding="utf-8")
    assert outputs_of(refresh.execute(md, timeout=120)) == ["a CPU cell ran\n", ""]
    with pytest.raises(CellExecutionError, match="a cuda cell ran"):
        refresh.execute(md, timeout=120, cuda_cells=True)  # what bookbuild.gpu_run executes


@pytest.mark.slow  # a second pytest with nbval: about 30 s on a loaded 2-core machine
def test_nbval_skips_a_cuda_cell(tmp_path):
    nb = tmp_path / "x.ipynb"
    nbformat.write(jupytext.reads(CUDA_CHAPTER, fmt="md:myst"), nb)
    r = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--nbval", "-q", nb.name],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "1 passed, 1 skipped" in r.stdout, r.stdout + r.stderr


def test_refresh_records_the_run_time_and_the_calibration(monkeypatch, tmp_path):
    import json

    from bookbuild import refresh
    sys.path.insert(0, str(refresh.REPO / "code"))
    import measure
    monkeypatch.setattr(measure, "RUN_TIMES", tmp_path / "run_times.json")
    monkeypatch.setattr(measure, "calibration_step_s", lambda: 0.123456)
    (tmp_path / "run_times.json").write_text(json.dumps({"02_speed": {"seconds": 5.0, "step_s": 0.1}}))
    refresh.record_run_time("01_data_model", 61.26)
    stored = json.loads((tmp_path / "run_times.json").read_text())
    assert list(stored) == ["01_data_model", "02_speed"] and stored["02_speed"]["seconds"] == 5.0
    assert stored["01_data_model"]["seconds"] == 61.3 and stored["01_data_model"]["step_s"] == 0.1235

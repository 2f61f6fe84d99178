"""How the book build avoids executing a chapter twice, and keeps CUDA cells off machines without CUDA.

- nbval's outputs are stored in the book's execution cache under a key that the build finds from
  the chapter's .md (bookbuild/cache.py, bookbuild/nbval_hooks.py); a failed or partial run is not stored.
- bookbuild/cuda.py adds `skip-execution` to cells tagged `cuda` when there is no CUDA, in the source
  the build reads (bookbuild/sphinx_ext.py).
"""
import copy
from types import SimpleNamespace

import nbformat
import pytest
from jupyter_cache import get_cache
from jupyter_cache.base import CacheBundleIn
from myst_nb.core.config import NbParserConfig
from myst_nb.core.read import create_nb_reader, read_myst_markdown_notebook
from myst_parser.config.main import MdParserConfig

from bookbuild import cache, cuda, sphinx_ext
from bookbuild.book import REPO


def _run(nb, outputs, failed=False):
    return {"nb": nb, "outputs": outputs, "failed": failed, "start": 0.0, "inputs": ""}


# what the source-read hook uses of Sphinx's app: where a page's source file is
APP = SimpleNamespace(env=SimpleNamespace(doc2path=lambda docname: REPO / f"{docname}.md"))


@pytest.mark.parametrize("chapter", ["02_speed", "06_gpu"])
def test_the_build_finds_a_chapter_that_nbval_ran(tmp_path, chapter, monkeypatch):
    monkeypatch.setattr(cuda, "has_cuda", lambda: False)
    ipynb = nbformat.read(REPO / "chapters" / f"{chapter}.ipynb", as_version=4)
    outputs = {id(c): c.outputs for c in ipynb.cells if c.cell_type == "code"}
    md_path = REPO / "chapters" / f"{chapter}.md"
    done = cache.executed_notebook(_run(ipynb, outputs), cache.as_the_build_reads(md_path))
    store = get_cache(str(tmp_path / "cache"))
    store.cache_notebook_bundle(CacheBundleIn(done, str(md_path)), check_validity=False, overwrite=True)
    # what myst-nb reads in a build: the page's source after the book's source-read hook
    source = [md_path.read_text(encoding="utf-8")]
    sphinx_ext.skip_cuda_cells_without_cuda(APP, f"chapters/{chapter}", source)
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


SOURCE = """```{code-cell} ipython3
:tags: [cuda]
x = 1
```

```{code-cell} ipython3
:tags: [remove-cell]
y = 2
```

```{code-cell} ipython3
:tags: [hide-input, cuda]
z = 3
```
"""


def test_cuda_cells_get_skip_execution_only_without_cuda(monkeypatch):
    monkeypatch.setattr(cuda, "has_cuda", lambda: False)
    source = [SOURCE]
    sphinx_ext.skip_cuda_cells_without_cuda(APP, "chapters/x", source)
    assert ":tags: [cuda, skip-execution]" in source[0]
    assert ":tags: [hide-input, cuda, skip-execution]" in source[0]
    assert ":tags: [remove-cell]" in source[0]
    nb = read_myst_markdown_notebook(source[0])
    assert [c.metadata.get("tags") for c in nb.cells if c.cell_type == "code"] == [
        ["cuda", "skip-execution"], ["remove-cell"], ["hide-input", "cuda", "skip-execution"]]
    assert [cuda.is_cuda_cell(c) for c in nb.cells if c.cell_type == "code"] == [True, False, True]
    assert cuda.nbclient_skip_tag() == "cuda"  # the refresh leaves them unexecuted too

    monkeypatch.setattr(cuda, "has_cuda", lambda: True)
    source = [SOURCE]
    sphinx_ext.skip_cuda_cells_without_cuda(APP, "chapters/x", source)
    assert source[0] == SOURCE
    assert cuda.nbclient_skip_tag() != "cuda"


def test_a_cuda_cell_with_yaml_options_is_skipped_too(monkeypatch):
    """A cell whose options are a `---` YAML block (as a figure's alt text needs) is read the same way."""
    monkeypatch.setattr(cuda, "has_cuda", lambda: False)
    yaml_cell = "```{code-cell} ipython3\n---\ntags: [cuda]\nmystnb:\n  image:\n    alt: a figure\n---\nw = 4\n```\n"
    source = [SOURCE + "\n" + yaml_cell]
    sphinx_ext.skip_cuda_cells_without_cuda(APP, "chapters/x", source)
    nb = read_myst_markdown_notebook(source[0])
    last = [c for c in nb.cells if c.cell_type == "code"][-1]
    assert last.metadata["tags"] == ["cuda", "skip-execution"] and last.source == "w = 4"
    assert last.metadata["mystnb"] == {"image": {"alt": "a figure"}}
    assert len(cuda.cuda_cells(SOURCE + yaml_cell)) == 3

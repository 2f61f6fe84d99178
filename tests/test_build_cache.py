"""How the book build avoids executing a chapter twice, re-executes only the pages a change can affect,
and never executes a CUDA cell.

- A page's key is the files its execution can read (bookbuild/reads.py); a change re-executes only the
  pages whose key it changes, and a page that loads a code/ file outside its key fails (the run-time trace).
- nbval's outputs are stored in the book's execution cache under a key that the build finds from
  the chapter's .md (bookbuild/cache.py, bookbuild/nbval_hooks.py); a failed or partial run is not stored.
- A cell tagged `cuda` carries `skip-execution` and `nbval-skip` (bookbuild/cuda.py): the build's
  executor, the refresh and nbval each leave it unexecuted; only bookbuild.gpu_run runs it.
"""
import copy
import json
import os
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

from bookbuild import book, cache, reads, refresh, sphinx_ext
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


# ---- each page keyed on what it can see ----

def page(tmp_path, name, *cells):
    """A page (a MyST notebook) with these code cells, its paired .ipynb beside it."""
    md = tmp_path / f"{name}.md"
    md.write_text(CUDA_CHAPTER.split("# A chapter")[0] + "# A page\n\n" + "".join(
        f"```{{code-cell}} ipython3\n{cell}\n```\n\n" for cell in cells), encoding="utf-8")
    nbformat.write(jupytext.read(md), md.with_suffix(".ipynb"))
    return md


SETUP = "import sys\nfrom pathlib import Path\nsys.path.insert(0, {code!r})"


def test_the_static_reading_follows_imports_in_functions_and_started_scripts(tmp_path):
    code, data = tmp_path / "code", tmp_path / "data"
    code.mkdir(), data.mkdir()
    (data / "corpus.txt").write_text("text")
    (code / "a.py").write_text("def f():\n    import b\n")          # an import inside a function
    (code / "b.py").write_text("from c import x\nCORPUS = 'corpus.txt'\n")
    (code / "c.py").write_text("x = 1\n")
    (code / "script.py").write_text("import d\n")
    (code / "d.py").write_text("")
    (code / "prints.py").write_text("COMMAND = 'python code/script.py'\n")  # prose in code/: not a start
    (code / "unused.py").write_text("")
    cell = "%time import a\n!ls\nrun_script(CODE / 'script.py', [])\nimport prints"
    found = {p.relative_to(tmp_path).as_posix() for p in reads.closure([cell], code, data)}
    assert found == {"code/a.py", "code/b.py", "code/c.py", "code/script.py", "code/d.py", "code/prints.py",
                     "data/corpus.txt"}


def test_touching_train_gpu_changes_the_key_of_only_the_pages_that_can_see_it(monkeypatch):
    """The pages that start code/train_gpu.py or import it, and no others (the issue's static reading:
    six pages, 12_3 simulating its step at full size). On the old code a change to any file of code/ changed
    every page's key."""
    sees = {md.stem for md in book.chapters() if "code/train_gpu.py" in reads.page_files(md)}
    assert sees == {"08_1_bytes", "08_2_here", "10_gpu", "11_gpu_run", "11_2_mfu", "12_3_full_size"}
    before = cache.page_keys()
    real = cache.file_digest
    monkeypatch.setattr(cache, "file_digest",
                        lambda path: "touched" if path == REPO / "code" / "train_gpu.py" else real(path))
    after = cache.page_keys()
    assert {md.stem for md in before if before[md] != after[md]} == sees


def test_the_execution_cache_drops_only_the_executions_whose_key_changed(tmp_path, monkeypatch):
    monkeypatch.setattr(cache, "CACHE", tmp_path / "cache")
    monkeypatch.setattr(cache, "CACHE_KEYS", tmp_path / "keys.json")
    mds = [REPO / "chapters" / f"{name}.md" for name in ("02_speed", "10_gpu")]
    for md in mds:
        nb = cache.as_the_build_reads(md)
        cache.store(md, nb, "key-1", 1.0)
    store = cache.execution_cache({mds[0]: "key-1", mds[1]: "key-2"})  # 10_gpu's inputs changed
    assert [r.uri for r in store.list_cache_records()] == [str(mds[0])]
    assert store.match_cache_notebook(cache.as_the_build_reads(mds[0])) is not None
    assert list(json.loads(cache.CACHE_KEYS.read_text()).values()) == ["key-1"]


def traced_python(log, source, cwd):
    env = {**os.environ, **reads.traced_env(log)}
    subprocess.run([sys.executable, "-c", source], env=env, cwd=cwd, check=True, timeout=120)


def test_the_trace_sees_a_dynamic_import_in_a_child_process_and_a_page_fails_on_it(tmp_path):
    """The kernel's stand-in: a process traced as the build and nbval trace a kernel. It imports
    code/shapes.py by name and starts a child that loads code/gpus.py by a name built at run time."""
    child = f"import importlib, sys; sys.path.insert(0, {str(REPO / 'code')!r}); importlib.import_module('g' + 'pus')"
    md = page(tmp_path, "dynamic", SETUP.format(code=str(REPO / "code")), "import shapes",
              f"import subprocess\nsubprocess.run([sys.executable, '-c', {child!r}])")
    log = tmp_path / "dynamic.log"
    traced_python(log, "\n".join(reads.code_cells(md)), cwd=tmp_path)
    assert {"code/shapes.py", "code/gpus.py"} <= reads.loaded(log)
    assert reads.unseen(md, log) == ["code/gpus.py"]  # not in the static reading: the page fails on it
    assert "loaded code/gpus.py, which its cache key does not cover" in reads.verdict(md, log)
    assert "without the run-time trace" in reads.verdict(md, tmp_path / "no.log")


def test_a_reader_running_a_page_is_not_traced(tmp_path):
    """Only a kernel that the build or nbval starts carries the trace: a reader's has no sitecustomize
    of the book's, and with the folder on the path but no log named, no hook is added."""
    probe = "import sys; print('sitecustomize' in sys.modules, len(sys.argv))"
    reader = {k: v for k, v in os.environ.items() if k not in (reads.LOG_VAR, "PYTHONPATH")}

    def run(env):
        return subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True).stdout
    assert run(reader).split()[0] == "False"
    assert run({**reader, **reads.traced_env(tmp_path / "log")}).split()[0] == "True"
    untraced = {**reader, "PYTHONPATH": str(reads.TRACE_DIR)}
    subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {str(REPO / 'code')!r}); import shapes"],
                   env=untraced, check=True)
    assert not (tmp_path / "log").exists()


def nbval(tmp_path, *notebooks, env=None):
    """pytest with nbval and the chapters' hooks over these notebooks, as the test command runs them."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "code")]), **(env or {})}
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "bookbuild.nbval_hooks",
                           "--nbval", "--nbval-current-env", "-q", *notebooks], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.slow  # two pytest runs with nbval: about 15 s on a loaded 2-core machine
def test_nbval_fails_a_page_that_loads_a_file_outside_its_key_and_skips_an_unchanged_one(tmp_path):
    setup = SETUP.format(code=str(REPO / "code"))
    page(tmp_path, "zz_static_test_page", setup, "import shapes\nprint(shapes.__name__)")
    page(tmp_path, "zz_dynamic_test_page", setup,
         "import importlib\nprint(importlib.import_module('g' + 'pus').__name__)")
    try:
        r = nbval(tmp_path, "zz_static_test_page.ipynb", "zz_dynamic_test_page.ipynb")
        assert r.returncode == 1 and "1 failed, 3 passed" in r.stdout, r.stdout + r.stderr
        assert "zz_dynamic_test_page.md loaded code/gpus.py, which its cache key does not cover" in r.stdout
        r = nbval(tmp_path, "zz_static_test_page.ipynb", "zz_dynamic_test_page.ipynb",
                  env={"BOOK_NBVAL_CHANGED_ONLY": "1"})  # the page that passed is left out, the one that failed runs
        assert "1 failed, 1 passed, 2 deselected" in r.stdout, r.stdout + r.stderr
    finally:
        for stem in ("zz_static_test_page", "zz_dynamic_test_page"):
            cache.record_nbval(tmp_path / f"{stem}.md", None)


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

"""Stored GPU outputs: a GPU run stores the cuda cells' outputs (bookbuild/gpu_run.py), the refresh keeps
them, and the build shows them below their cells, labelled, or says why it cannot."""
import subprocess
import sys

import jupytext
import nbformat
import pytest
import torch

from bookbuild import cuda, gpu_run
from bookbuild.book import REPO

CHAPTER = """\
# A chapter

```{code-cell} ipython3
x = 1
```

```{code-cell} ipython3
:tags: [cuda, skip-execution, nbval-skip]
print("tokens/s", 123)
```

Between.

````{code-cell} ipython3
---
tags: [cuda, skip-execution, nbval-skip]
mystnb:
  image:
    alt: a figure
---
print("second")  # a cell with a YAML block of options, in a four-backtick fence
````
"""
LABEL = {"gpu": "NVIDIA H200", "gpu_count": 1, "date": "2026-11-30", "commit": "abc1234"}


def stream(text):
    return nbformat.v4.new_output("stream", name="stdout", text=text)


@pytest.fixture
def chapter(tmp_path):
    md = tmp_path / "09_x.md"
    md.write_text(CHAPTER, encoding="utf-8")
    nb = jupytext.reads(CHAPTER, fmt="md:myst")
    nbformat.write(nb, md.with_suffix(".ipynb"))
    return md


def gpu_executed(md, first="tokens/s 123\n"):
    nb = jupytext.reads(md.read_text(encoding="utf-8"), fmt="md:myst")
    cells = [c for c in nb.cells if c.cell_type == "code" and cuda.is_cuda_cell(c)]
    cells[0].outputs = [stream(first)]
    cells[1].outputs = [stream("second\n")]
    return nb


def store(md, executed):
    ref = nbformat.read(md.with_suffix(".ipynb"), as_version=4)
    texts = gpu_run.store_gpu_outputs(ref, executed, LABEL)
    nbformat.write(ref, md.with_suffix(".ipynb"))
    return texts


def test_without_a_stored_run_the_page_says_so(chapter):
    shown = cuda.show_stored_gpu_outputs(chapter.read_text(encoding="utf-8"), chapter)
    assert shown.count("还没有它在 GPU 上运行的存档输出") == 2
    assert cuda.stored_gpu_run(chapter) is None


def test_stored_outputs_are_shown_below_their_cells_with_the_label(chapter):
    assert store(chapter, gpu_executed(chapter)) == ["tokens/s 123\n", "second\n"]
    shown = cuda.show_stored_gpu_outputs(chapter.read_text(encoding="utf-8"), chapter)
    first, second = shown.index("tokens/s 123\n```"), shown.index("second\n```")
    assert shown.index('print("tokens/s", 123)') < first < shown.index('print("second")') < second
    assert shown.count("存档的 GPU 输出：NVIDIA H200，2026-11-30，提交 abc1234") == 2
    assert cuda.stored_gpu_run(chapter) == LABEL
    # Markdown only: the code cells the build executes (and caches) are the same
    code = [c.source for c in jupytext.reads(shown, fmt="md:myst").cells if c.cell_type == "code"]
    assert code == [c.source for c in jupytext.reads(CHAPTER, fmt="md:myst").cells if c.cell_type == "code"]


def test_a_cell_changed_since_the_run_shows_no_stale_output(chapter):
    store(chapter, gpu_executed(chapter))
    edited = chapter.read_text(encoding="utf-8").replace('print("second")', 'print("changed")')
    shown = cuda.show_stored_gpu_outputs(edited, chapter)
    assert "tokens/s 123" in shown and "second\n```" not in shown
    assert "之后改过，存档的输出属于旧的代码" in shown


def test_backticks_in_an_output_do_not_break_the_block(chapter):
    store(chapter, gpu_executed(chapter, first="a ``` b\n"))
    shown = cuda.show_stored_gpu_outputs(chapter.read_text(encoding="utf-8"), chapter)
    assert "````text\na ``` b\n````" in shown


def test_a_chapter_without_cuda_cells_is_left_alone(tmp_path):
    md = tmp_path / "09_x.md"
    plain = CHAPTER.split("```{code-cell} ipython3\n:tags: [cuda")[0]
    assert cuda.show_stored_gpu_outputs(plain, md) == plain


def test_a_refresh_without_cuda_keeps_the_stored_outputs(chapter):
    store(chapter, gpu_executed(chapter))
    old = nbformat.read(chapter.with_suffix(".ipynb"), as_version=4)
    fresh = jupytext.reads(chapter.read_text(encoding="utf-8").replace('print("second")', 'print("changed")'),
                           fmt="md:myst")
    cuda.keep_stored_gpu_outputs(fresh, old)
    outs = [c.outputs for c in fresh.cells if c.cell_type == "code" and cuda.is_cuda_cell(c)]
    assert outs[0][0]["text"] == "tokens/s 123\n" and outs[1] == []  # the changed cell keeps nothing
    assert fresh.metadata[cuda.GPU_RUN_KEY] == LABEL


def test_storing_into_an_ipynb_older_than_the_md_is_refused(chapter):
    executed = gpu_executed(chapter)
    executed.cells[-1].source = 'print("only in the md")'
    with pytest.raises(ValueError, match="refresh"):
        store(chapter, executed)


def test_the_book_has_one_chapter_with_cuda_cells_and_its_cells_match_its_ipynb():
    (md,) = gpu_run.cuda_chapters()
    ipynb = nbformat.read(md.with_suffix(".ipynb"), as_version=4)
    in_md = [c.source for c in jupytext.read(md).cells if c.cell_type == "code" and cuda.is_cuda_cell(c)]
    assert in_md and in_md == [s for s, _ in cuda.stored_cuda_outputs(ipynb)]


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_the_gpu_run_without_cuda_is_one_sentence():
    r = subprocess.run([sys.executable, "-m", "bookbuild.gpu_run"], cwd=REPO, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr == "error: this machine has no CUDA GPU; the cells tagged `cuda` need one\n"

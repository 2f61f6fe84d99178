"""The cuda-cell rule: cells tagged `cuda` (chapter 11) never execute where they could meet a CPU.

The rule is written in the chapter itself, as static tags on each such cell (TAGS): `skip-execution`,
which the build (myst-nb) and the refresh (nbclient) do not execute, and `nbval-skip`, which nbval
skips; tests/test_chapter_checklist.py checks that every `cuda` cell carries all three. Only
bookbuild/gpu_run.py runs them, on a machine with a GPU, and stores their outputs in the chapter's
.ipynb; the refresh keeps those outputs (keep_stored_gpu_outputs), and the page shows them below their
cells, labelled (show_stored_gpu_outputs). A reader who opens the chapter in Jupyter on a GPU machine
runs them as any other cell.
"""
import re
from pathlib import Path

TAG = "cuda"
SKIP_TAG = "skip-execution"  # the tag that myst-nb and nbclient do not execute
NBVAL_SKIP_TAG = "nbval-skip"  # the tag that nbval skips
TAGS = [TAG, SKIP_TAG, NBVAL_SKIP_TAG]  # what every cuda cell carries, in the .md and the .ipynb


def is_cuda_cell(cell) -> bool:
    """Whether a notebook cell (nbformat or nbval's dict) is tagged `cuda`."""
    return TAG in cell.get("metadata", {}).get("tags", [])


def cuda_cells(text: str) -> list:
    """The cells tagged `cuda` of a chapter's MyST source, as (cell, end): the code cell as myst-nb
    reads it, and the index of the line after its closing fence."""
    from myst_nb.core.read import read_myst_markdown_notebook
    nb = read_myst_markdown_notebook(text, add_source_map=True)
    lines = text.split("\n")
    found = []
    for cell, start in zip(nb.cells, nb.metadata["source_map"]):
        if cell.cell_type != "code" or not is_cuda_cell(cell):
            continue
        # `start` is the line after the cell's opening fence; the cell ends at the first line that is
        # only the fence's character, at least as many times
        fence = re.match(r"[`~]{3,}", lines[start - 1].lstrip()).group()
        closing = re.compile(re.escape(fence[0]) + "{%d,}" % len(fence))
        end = next(i for i in range(start, len(lines)) if closing.fullmatch(lines[i].strip()))
        found.append((cell, end + 1))
    return found


# ---- outputs of the last real GPU run, shown below the cells the build does not run ---------------------------
#
# bookbuild/gpu_run.py executes a chapter's cuda cells on a GPU and stores their outputs in the chapter's
# .ipynb, with the notebook metadata key `gpu_run` saying on what GPU, when and at which commit. The build
# shows those stored outputs below each cell, labelled as such; a cell that changed since
# that run shows none (its stored output would belong to other code); without a stored run the page
# says that too. Never blank, never invented.

GPU_RUN_KEY = "gpu_run"


def _read_notebook(md):
    import nbformat
    ipynb = Path(md).with_suffix(".ipynb")
    return nbformat.read(ipynb, as_version=4) if ipynb.is_file() else None


def stored_gpu_run(md) -> dict | None:
    """What the chapter's .ipynb says of its stored GPU run ({'gpu', 'date', 'commit', ...}), or None."""
    nb = _read_notebook(md)
    return None if nb is None else nb.metadata.get(GPU_RUN_KEY)


def stored_cuda_outputs(nb) -> list:
    """(source, outputs) of each cuda cell of a notebook, in order."""
    return [(c.source, c.get("outputs", [])) for c in nb.cells if c.cell_type == "code" and is_cuda_cell(c)]


def _output_text(outputs: list) -> str:
    parts = []
    for out in outputs:
        if out.get("output_type") == "stream":
            parts.append(out.get("text", ""))
        elif out.get("output_type") in ("execute_result", "display_data"):
            data = out.get("data", {})
            parts.append(data["text/plain"] + "\n" if "text/plain" in data else "[a figure, not shown here]\n")
        elif out.get("output_type") == "error":
            parts.append(f"{out.get('ename')}: {out.get('evalue')}\n")
    return "".join(parts).rstrip("\n")


def _fence(text: str) -> str:
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    return "`" * max(3, longest + 1)


def gpu_output_block(source: str, stored: dict | None, run: dict | None) -> str:
    """The Markdown the build shows below one cuda cell."""
    if run is None or stored is None:
        return (":::{note}\n构建不执行上面这一格（它要在 GPU 上运行）；仓库里也还没有它在 GPU 上运行的存档输出"
                "（`python -m bookbuild.gpu_run` 在有 GPU 的机器上生成）。\n:::")
    if stored["source"].rstrip("\n") != source:
        return (f":::{{note}}\n构建不执行上面这一格（它要在 GPU 上运行）。"
                f"它在上次 GPU 运行（{run['gpu']}，{run['date']}）之后改过，存档的输出属于旧的代码，所以不显示。\n:::")
    text = _output_text(stored["outputs"]) or "（这一格没有输出）"
    fence = _fence(text)
    return (f":::{{admonition}} 存档的 GPU 输出：{run['gpu']}，{run['date']}，提交 {run['commit']}\n:class: note\n"
            f"构建不执行上面这一格（它要在 GPU 上运行）；下面是它上次在 GPU 上运行时的输出，不是这次构建算的。\n\n"
            f"{fence}text\n{text}\n{fence}\n:::")


def show_stored_gpu_outputs(text: str, md) -> str:
    """A chapter's MyST source with, below each cuda cell, its stored GPU outputs (or why there are
    none). Markdown only: the execution cache keys on code cells, so the cache entries of a chapter
    are the same with or without these blocks."""
    cells = cuda_cells(text)
    if not cells:
        return text
    nb = _read_notebook(md)
    run = None if nb is None else nb.metadata.get(GPU_RUN_KEY)
    stored = [] if nb is None else [dict(source=s, outputs=o) for s, o in stored_cuda_outputs(nb)]
    lines = text.split("\n")
    for i, (cell, end) in reversed(list(enumerate(cells))):
        block = gpu_output_block(cell.source, stored[i] if i < len(stored) else None, run)
        lines[end:end] = ["", block, ""]
    return "\n".join(lines)


def keep_stored_gpu_outputs(nb, old) -> None:
    """Copy into `nb` (just executed, its cuda cells skipped) the stored GPU outputs of `old` (the .ipynb it
    replaces): each unexecuted cuda cell whose source is unchanged keeps its outputs, and the notebook
    keeps the run's label while any cell still carries that run's outputs."""
    if old is None or GPU_RUN_KEY not in old.metadata:
        return
    stored = {s: o for s, o in stored_cuda_outputs(old)}
    kept = False
    for cell in nb.cells:
        if cell.cell_type == "code" and is_cuda_cell(cell) and not cell.get("outputs") and cell.source in stored:
            cell.outputs = stored[cell.source]
            kept = kept or bool(cell.outputs)
    if kept:
        nb.metadata[GPU_RUN_KEY] = old.metadata[GPU_RUN_KEY]

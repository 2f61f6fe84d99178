"""The cuda-cell rule: cells tagged `cuda` (chapter 6) execute only where CUDA exists.

Elsewhere they are skipped, not failed, by all three things that execute chapters: nbval skips them
(nbval_hooks.py), the build reads them with `skip-execution` added (skip_cuda_cells, as sphinx_ext.py's
source-read hook), and the refresh leaves them unexecuted (nbclient_skip_tag) and keeps the outputs a
GPU run stored for them (keep_stored_gpu_outputs). Where they did not run, the page shows those stored
outputs, labelled (show_stored_gpu_outputs).
"""
import re
from pathlib import Path

TAG = "cuda"
SKIP_TAG = "skip-execution"  # the tag that myst-nb and nbclient do not execute


def has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def is_cuda_cell(cell) -> bool:
    """Whether a notebook cell (nbformat or nbval's dict) is tagged `cuda`."""
    return TAG in cell.get("metadata", {}).get("tags", [])


CODE_CELL = re.compile(r"(?ms)^```\{code-cell\}[^\n]*\n(.*?)^```[ \t]*$")
# a cell's tags, in either form MyST takes for a code cell's options: `:tags: [a, b]` lines, or a
# `---` YAML block holding `tags: [a, b]`
OPTIONS_TAGS = re.compile(r"(?m)^(:tags:|tags:)[ \t]*\[([^\]\n]*)\]")


def _options(body: str) -> str:
    """The options part of a MyST code cell's body: its `---` YAML block, or its leading `:key:` lines."""
    lines = body.split("\n")
    if lines[0].strip() == "---":
        return "\n".join(lines[:lines.index("---", 1) + 1])
    return "\n".join(line for line in lines[:next((i for i, x in enumerate(lines) if not x.startswith(":")),
                                                      len(lines))])


def _tags_of(options: str) -> list[str]:
    m = OPTIONS_TAGS.search(options)
    return [t.strip() for t in m.group(2).split(",") if t.strip()] if m else []


def cuda_cells(text: str) -> list:
    """The code cells of a chapter's MyST source that are tagged `cuda`, as regex matches (group 1: body)."""
    return [m for m in CODE_CELL.finditer(text) if TAG in _tags_of(_options(m.group(1)))]


def skip_cuda_cells(text: str) -> str:
    """A chapter's MyST source with `skip-execution` added to every cell tagged `cuda`, if there is no CUDA."""
    cells = cuda_cells(text)
    if not cells or has_cuda():
        return text
    pieces, last = [], 0
    for m in cells:
        body = m.group(1)
        options = _options(body)
        tags = _tags_of(options)
        if SKIP_TAG not in tags:
            key = OPTIONS_TAGS.search(options).group(1)
            options_now = OPTIONS_TAGS.sub(f"{key} [{', '.join([*tags, SKIP_TAG])}]", options, count=1)
            body = options_now + body[len(options):]
        pieces += [text[last:m.start(1)], body]
        last = m.end(1)
    return "".join(pieces) + text[last:]


def nbclient_skip_tag() -> str:
    """The tag of the cells that nbclient should not execute (nbclient takes one tag)."""
    return SKIP_TAG if has_cuda() else TAG


# ---- outputs of the last real GPU run, shown where the cells could not run ----------------------------
#
# bookbuild/gpu_run.py executes a chapter's cuda cells on a GPU and stores their outputs in the chapter's
# .ipynb, with the notebook metadata key `gpu_run` saying on what GPU, when and at which commit. A build
# without CUDA shows those stored outputs below each cell, labelled as such; a cell that changed since
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


def _cell_source(body: str) -> str:
    """The code of a MyST code cell's body: after its `:key: value` lines or its `---` YAML block."""
    lines = body.split("\n")
    if lines and lines[0].strip() == "---":
        end = lines.index("---", 1)
        lines = lines[end + 1:]
    else:
        while lines and lines[0].startswith(":"):
            lines = lines[1:]
    while lines and not lines[0].strip():
        lines = lines[1:]
    return "\n".join(lines).rstrip("\n")


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
    """The Markdown shown below one cuda cell in a build without CUDA."""
    if run is None or stored is None:
        return (":::{note}\n这台机器没有 CUDA，上面这一格没有执行；仓库里也还没有它在 GPU 上运行的存档输出"
                "（`python -m bookbuild.gpu_run` 在有 GPU 的机器上生成）。\n:::")
    if stored["source"].rstrip("\n") != source:
        return (f":::{{note}}\n这台机器没有 CUDA，上面这一格没有执行。它在上次 GPU 运行（{run['gpu']}，{run['date']}）"
                "之后改过，存档的输出属于旧的代码，所以不显示。\n:::")
    text = _output_text(stored["outputs"]) or "（这一格没有输出）"
    fence = _fence(text)
    return (f":::{{admonition}} 存档的 GPU 输出：{run['gpu']}，{run['date']}，提交 {run['commit']}\n:class: note\n"
            f"这台机器没有 CUDA，上面这一格没有执行；下面是它上次在 GPU 上运行时的输出，不是这次构建算的。\n\n"
            f"{fence}text\n{text}\n{fence}\n:::")


def show_stored_gpu_outputs(text: str, md) -> str:
    """A chapter's MyST source with, below each cuda cell, its stored GPU outputs (or why there are
    none), if this machine has no CUDA. Markdown only: the execution cache keys on code cells, so the
    cache entries of a chapter are the same with or without these blocks."""
    cells = cuda_cells(text)
    if not cells or has_cuda():
        return text
    nb = _read_notebook(md)
    run = None if nb is None else nb.metadata.get(GPU_RUN_KEY)
    stored = [] if nb is None else [dict(source=s, outputs=o) for s, o in stored_cuda_outputs(nb)]
    pieces, last = [], 0
    for i, m in enumerate(cells):
        block = gpu_output_block(_cell_source(m.group(1)), stored[i] if i < len(stored) else None, run)
        pieces += [text[last:m.end()], "\n\n", block, "\n"]
        last = m.end()
    return "".join(pieces) + text[last:]


def keep_stored_gpu_outputs(nb, old) -> None:
    """Copy into `nb` (just executed without CUDA) the stored GPU outputs of `old` (the .ipynb it
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

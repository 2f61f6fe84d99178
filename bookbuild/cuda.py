"""The cuda-cell rule: cells tagged `cuda` (chapter 6) execute only where CUDA exists.

Elsewhere they are skipped, not failed, by all three things that execute chapters: nbval skips them
(nbval_hooks.py), the build reads them with `skip-execution` added (skip_cuda_cells, as sphinx_ext.py's
source-read hook), and the refresh leaves them unexecuted (nbclient_skip_tag). A chapter's .ipynb may
hold the outputs of a stored GPU run (stored_gpu_run).
"""
import json
import re
from pathlib import Path

TAG = "cuda"
SKIP_TAG = "skip-execution"  # the tag that myst-nb and nbclient do not execute
TAGS_LINE = re.compile(r"(?m)^:tags: \[([^\]\n]*)\]")


def has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def is_cuda_cell(cell) -> bool:
    """Whether a notebook cell (nbformat or nbval's dict) is tagged `cuda`."""
    return TAG in cell.get("metadata", {}).get("tags", [])


def skip_cuda_cells(text: str) -> str:
    """A chapter's MyST source with `skip-execution` added to every cell tagged `cuda`, if there is no CUDA."""
    if not any(TAG in _tags(m) for m in TAGS_LINE.finditer(text)) or has_cuda():
        return text

    def add_skip(match):
        tags = _tags(match)
        if TAG in tags and SKIP_TAG not in tags:
            tags.append(SKIP_TAG)
        return f":tags: [{', '.join(tags)}]"

    return TAGS_LINE.sub(add_skip, text)


def _tags(match) -> list[str]:
    return [t.strip() for t in match.group(1).split(",") if t.strip()]


def nbclient_skip_tag() -> str:
    """The tag of the cells that nbclient should not execute (nbclient takes one tag)."""
    return SKIP_TAG if has_cuda() else TAG


def stored_gpu_run(md_path) -> dict | None:
    """The stored GPU run whose outputs a chapter's paired .ipynb holds for its cells tagged `cuda`:
    the notebook metadata `gpu_run` (e.g. {"gpu": "NVIDIA H200", "date": "2026-…", "commit": "abc1234"}),
    or None when the .ipynb holds no such run (or there is no .ipynb)."""
    ipynb = Path(md_path).with_suffix(".ipynb")
    if not ipynb.is_file():
        return None
    run = json.loads(ipynb.read_text(encoding="utf-8")).get("metadata", {}).get("gpu_run")
    return dict(run) if isinstance(run, dict) else None

"""Re-execute chapter notebooks from their .md source and store the outputs in the paired .ipynb.

    python tests/refresh_notebooks.py                 # every chapter
    python tests/refresh_notebooks.py 02_speed.md     # one chapter

Run it after editing a chapter's .md (or code/ it imports); nbval then checks the stored outputs.
"""
import sys
import time
from pathlib import Path

import jupytext
import nbformat
from nbclient import NotebookClient

CHAPTERS = Path(__file__).resolve().parent.parent / "chapters"


def refresh(md: Path) -> None:
    nb = jupytext.read(md)
    nb.metadata["kernelspec"] = {"display_name": "Python 3", "language": "python", "name": "python3"}
    t0 = time.perf_counter()
    import torch  # CUDA-tagged cells run only where CUDA exists
    skip = "no-such-tag" if torch.cuda.is_available() else "cuda"
    NotebookClient(nb, timeout=1800, kernel_name="python3", skip_cells_with_tag=skip, record_timing=False,
                   resources={"metadata": {"path": str(md.parent)}}).execute()
    out = md.with_suffix(".ipynb")
    tmp = out.with_suffix(".ipynb.tmp")
    nbformat.write(nb, tmp)
    tmp.replace(out)
    print(f"{md.name}: {time.perf_counter() - t0:.0f} s")


def main(names):
    mds = [CHAPTERS / n if not Path(n).exists() else Path(n) for n in names] or sorted(
        p for p in CHAPTERS.glob("*.md") if "jupytext:" in p.read_text(encoding="utf-8")[:400])
    for md in mds:
        if not md.is_file():
            sys.exit(f"error: no chapter {md}")
        refresh(md)


if __name__ == "__main__":
    main(sys.argv[1:])

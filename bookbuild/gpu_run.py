"""Run the chapters' cells tagged `cuda` on a GPU and store their outputs in the chapters' .ipynb.

    python -m bookbuild.gpu_run                     # every chapter that has cells tagged `cuda`
    python -m bookbuild.gpu_run --copy-to DIR       # also copy the updated .ipynb files into DIR

On a machine with CUDA (one GPU is enough), it executes each such chapter from its .md, the cuda cells
included (the one executor that runs them: the build, nbval and the refresh skip them by their
static tags, cuda.py), and writes the cuda cells' outputs into the chapter's .ipynb with the notebook
metadata `gpu_run`: the GPU's name and count, the date, the commit, the versions and how long it took. The other
cells keep the reference outputs of the CPU run, which nbval checks on every machine. The build then
shows these outputs below their cells, labelled with that GPU, date and commit (cuda.py).
Commit the changed .ipynb. Chapter 11's cuda cells include a 124M-class run of train_gpu.py that prints
its MFU and its peak memory against the memory ledger; the whole run is meant to fit in 8 minutes.
"""
import shutil
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from .book import REPO, chapters, script_arguments, warm_font_cache
from .cuda import GPU_RUN_KEY, cuda_cells, is_cuda_cell
from .refresh import execute

TIME_GOAL_S = 8 * 60


def cuda_chapters() -> list[Path]:
    """The chapters with at least one cell tagged `cuda`."""
    return [md for md in chapters() if cuda_cells(md.read_text(encoding="utf-8"))]


def run_label(seconds: float) -> dict:
    """What the page says of this run: GPU, count, date, commit and versions."""
    import torch
    sys.path.insert(0, str(REPO / "code"))
    from record import git_state  # the one git lookup, as the chapters' record and train_gpu.py's run.json
    commit, dirty = git_state()
    return {"gpu": torch.cuda.get_device_name(0), "gpu_count": torch.cuda.device_count(),
            "sm_count": torch.cuda.get_device_properties(0).multi_processor_count,
            "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"),
            "commit": "unknown" if commit is None else commit[:7] + ("+changes" if dirty else ""),
            "torch": torch.__version__, "cuda": torch.version.cuda, "seconds": round(seconds)}


def store_gpu_outputs(reference, executed, label: dict) -> list[str]:
    """Put the outputs of `executed`'s cuda cells into the same cells of `reference` (the chapter's
    .ipynb) and label the notebook with the run. Returns each stored cell's text output. A cuda cell
    of `executed` that `reference` lacks means the .ipynb is older than the .md: ValueError."""
    ref_cells = {c.source: c for c in reference.cells if c.cell_type == "code" and is_cuda_cell(c)}
    texts = []
    for cell in executed.cells:
        if cell.cell_type != "code" or not is_cuda_cell(cell):
            continue
        if cell.source not in ref_cells:
            raise ValueError("the .ipynb does not have this cuda cell of the .md; run "
                             "`python -m bookbuild.refresh` for the chapter first")
        ref_cells[cell.source].outputs = cell.outputs
        texts.append("".join(o.get("text", "") for o in cell.outputs if o.get("output_type") == "stream"))
    reference.metadata[GPU_RUN_KEY] = label
    return texts


def main(argv=None) -> int:
    arguments = script_arguments()
    ap = arguments.Parser(prog="python -m bookbuild.gpu_run", description=__doc__.splitlines()[0])
    ap.add_argument("--copy-to", type=Path, help="also copy each updated .ipynb into this folder")
    args = ap.parse_args(argv)
    try:
        import torch
    except ImportError:
        arguments.fail("torch is not installed; install requirements.txt first", arguments.REFUSED)
    if not torch.cuda.is_available():
        arguments.fail("this machine has no CUDA GPU; the cells tagged `cuda` need one", arguments.REFUSED)
    if args.copy_to is not None and args.copy_to.exists() and not args.copy_to.is_dir():
        arguments.fail(f"--copy-to {args.copy_to} is a file, not a folder")
    import nbformat
    warm_font_cache()
    t0 = time.perf_counter()
    for md in cuda_chapters():
        ipynb = md.with_suffix(".ipynb")
        reference = nbformat.read(ipynb, as_version=4)
        print(f"{md.name}: executing every cell, the cuda cells included ...", flush=True)
        try:
            executed = execute(md, timeout=TIME_GOAL_S, cuda_cells=True)
        except Exception as e:  # a failing cell: say which and store nothing
            arguments.fail(f"{md.name} failed on this GPU, nothing stored: {str(e).strip()[-2000:]}", arguments.REFUSED)
        try:
            texts = store_gpu_outputs(reference, executed, run_label(time.perf_counter() - t0))
        except ValueError as e:
            arguments.fail(f"{ipynb.name}: {e}", arguments.REFUSED)
        tmp = ipynb.with_suffix(".ipynb.tmp")
        nbformat.write(reference, tmp)
        tmp.replace(ipynb)
        print(f"{ipynb.name}: stored the outputs of {len(texts)} cuda cells ({reference.metadata[GPU_RUN_KEY]})")
        for i, text in enumerate(texts, 1):
            print(f"--- cuda cell {i} ---\n{text.rstrip()}")
        if args.copy_to is not None:
            args.copy_to.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ipynb, args.copy_to / ipynb.name)
    seconds = time.perf_counter() - t0
    over = "" if seconds <= TIME_GOAL_S else f" (over the {TIME_GOAL_S // 60}-minute goal)"
    print(f"done in {seconds:.0f} s{over}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Re-execute chapters from their .md source and store the outputs in the paired .ipynb.

    python -m bookbuild.refresh                   # every chapter in _toc.yml
    python -m bookbuild.refresh 02_speed.md       # one chapter (a name in chapters/ or a path)

Run it after editing a chapter's .md (or code/ it imports); nbval then checks the stored outputs.
The cells tagged `cuda` do not run (their `skip-execution` tag), and keep the outputs a GPU run stored
for them (bookbuild/gpu_run.py) as long as their code is unchanged.
"""
import sys
import time
from pathlib import Path

from .book import REPO, chapters, script_arguments, warm_font_cache
from .cuda import SKIP_TAG, is_cuda_cell, keep_stored_gpu_outputs


def execute(md: Path, timeout: int = 1800, cuda_cells: bool = False):
    """The chapter's .md as a notebook, executed top to bottom in its folder; cells tagged
    `skip-execution` are left out, except the cuda cells when cuda_cells is true (gpu_run.py)."""
    import jupytext
    from nbclient import NotebookClient

    nb = jupytext.read(md)
    for cell in nb.cells if cuda_cells else []:
        if is_cuda_cell(cell) and SKIP_TAG in cell.metadata.tags:
            cell.metadata.tags.remove(SKIP_TAG)
    nb.metadata["kernelspec"] = {"display_name": "Python 3", "language": "python", "name": "python3"}
    NotebookClient(nb, timeout=timeout, kernel_name="python3", skip_cells_with_tag=SKIP_TAG,
                   record_timing=False, resources={"metadata": {"path": str(md.parent)}}).execute()
    return nb


def refresh(md: Path) -> None:
    import nbformat

    t0 = time.perf_counter()
    nb = execute(md)
    out = md.with_suffix(".ipynb")
    if out.is_file():  # the cuda cells did not run: keep what a GPU run stored
        keep_stored_gpu_outputs(nb, nbformat.read(out, as_version=4))
    seconds = time.perf_counter() - t0
    tmp = out.with_suffix(".ipynb.tmp")
    nbformat.write(nb, tmp)
    tmp.replace(out)
    record_run_time(md.stem, seconds)
    print(f"{md.name}: {seconds:.0f} s", flush=True)


def record_run_time(chapter: str, seconds: float) -> None:
    """Store how long the chapter took and how fast a training step is here now, in chapters/run_times.json:
    what a chapter's estimate_run_time (code/measure.py) scales on a reader's machine."""
    import json

    sys.path.insert(0, str(REPO / "code"))
    import measure  # the calibration step trains: torch
    import record

    times = json.loads(measure.RUN_TIMES.read_text(encoding="utf-8")) if measure.RUN_TIMES.is_file() else {}
    times[chapter] = {"seconds": round(seconds, 1), "step_s": round(measure.calibration_step_s(), 4),
                      "cpu": record.cpu_name()}
    tmp = measure.RUN_TIMES.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(dict(sorted(times.items())), indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    tmp.replace(measure.RUN_TIMES)


def main(argv=None) -> int:
    ap = script_arguments().Parser(prog="python -m bookbuild.refresh", description=__doc__.splitlines()[0])
    ap.add_argument("chapters", nargs="*", metavar="NN_name.md",
                    help="chapters to refresh (default: every chapter in _toc.yml)")
    args = ap.parse_args(argv)
    book = chapters()
    folder = book[0].parent
    mds = [Path(n) if Path(n).exists() else folder / n for n in args.chapters] or book
    for md in mds:
        if not md.is_file():
            ap.error(f"there is no chapter {md.name} in chapters/")
    warm_font_cache()
    for md in mds:
        refresh(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())

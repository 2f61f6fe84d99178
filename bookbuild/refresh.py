"""Re-execute chapters from their .md source and store the outputs in the paired .ipynb.

    python -m bookbuild.refresh                   # every chapter in _toc.yml
    python -m bookbuild.refresh 02_speed.md       # one chapter (a name in chapters/ or a path)
    python -m bookbuild.refresh --timeout 0 09_scaling.md   # no limit on a cell (default: 1800 s a cell)
    python -m bookbuild.refresh --markdown-only 08_1_bytes.md   # only prose changed: copy it, run nothing

Run it after editing a chapter's .md (or code/ it imports); nbval then checks the stored outputs.
The cells tagged `cuda` do not run (their `skip-execution` tag), and keep the outputs a GPU run stored
for them (bookbuild/gpu_run.py) as long as their code is unchanged.
"""
import sys
import time
from pathlib import Path

from .book import REPO, chapters, script_arguments, warm_font_cache
from .cuda import SKIP_TAG, is_cuda_cell, keep_stored_gpu_outputs

CELL_TIMEOUT_S = 1800  # nbclient's limit on one cell; a loaded machine may need more (--timeout, 0: none)


def execute(md: Path, timeout: int | None = CELL_TIMEOUT_S, cuda_cells: bool = False):
    """The chapter's .md as a notebook, executed top to bottom in its folder; cells tagged
    `skip-execution` are left out, except the cuda cells when cuda_cells is true (gpu_run.py).
    timeout: seconds one cell may run; None or 0, no limit."""
    import jupytext
    from nbclient import NotebookClient

    nb = jupytext.read(md)
    for cell in nb.cells if cuda_cells else []:
        if is_cuda_cell(cell) and SKIP_TAG in cell.metadata.tags:
            cell.metadata.tags.remove(SKIP_TAG)
    nb.metadata["kernelspec"] = {"display_name": "Python 3", "language": "python", "name": "python3"}
    NotebookClient(nb, timeout=timeout or None, kernel_name="python3", skip_cells_with_tag=SKIP_TAG,
                   record_timing=False, resources={"metadata": {"path": str(md.parent)}}).execute()
    return nb


def refresh(md: Path, timeout: int | None = CELL_TIMEOUT_S) -> None:
    import nbformat

    t0 = time.perf_counter()
    nb = execute(md, timeout)
    out = md.with_suffix(".ipynb")
    if out.is_file():  # the cuda cells did not run: keep what a GPU run stored
        keep_stored_gpu_outputs(nb, nbformat.read(out, as_version=4))
    seconds = time.perf_counter() - t0
    tmp = out.with_suffix(".ipynb.tmp")
    nbformat.write(nb, tmp)
    tmp.replace(out)
    record_run_time(md.stem, seconds)
    print(f"{md.name}: {seconds:.0f} s", flush=True)


def _code_cells(nb) -> list:
    """Each cell's type and tags, and a code cell's source: what copy_markdown requires to be unchanged."""
    return [(c.cell_type, c.source.strip() if c.cell_type == "code" else "", sorted(c.metadata.get("tags", [])))
            for c in nb.cells]


def copy_markdown(md: Path) -> None:
    """Copy the .md's Markdown cells into the paired .ipynb, whose code cells and outputs stay: for an edit
    of prose only. Refused (one sentence) unless both hold the same cells in the same order with the same
    code and tags, so no stored output can belong to code that has changed."""
    import jupytext
    import nbformat

    out = md.with_suffix(".ipynb")
    source, stored = jupytext.read(md), nbformat.read(out, as_version=4) if out.is_file() else None
    if stored is None or _code_cells(source) != _code_cells(stored):
        script_arguments().refuse(f"{md.name}: its code cells differ from {out.name}'s (or there is none); "
                                  f"run python -m bookbuild.refresh {md.name}")
    for new, old in zip(source.cells, stored.cells, strict=True):
        if new.cell_type == "markdown":
            old.source = new.source
    tmp = out.with_suffix(".ipynb.tmp")
    nbformat.write(stored, tmp)
    tmp.replace(out)
    print(f"{md.name}: Markdown copied into {out.name}", flush=True)


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
    ap.add_argument("--timeout", type=script_arguments().non_negative_int, default=CELL_TIMEOUT_S, metavar="S",
                    help=f"seconds one cell may run before the refresh fails (default {CELL_TIMEOUT_S}; 0: no limit)")
    ap.add_argument("--markdown-only", action="store_true",
                    help="copy the Markdown cells into the .ipynb without running anything (code cells unchanged)")
    args = ap.parse_args(argv)
    book = chapters()
    folder = book[0].parent
    mds = [Path(n) if Path(n).exists() else folder / n for n in args.chapters] or book
    for md in mds:
        if not md.is_file():
            ap.error(f"there is no chapter {md.name} in chapters/")
    if args.markdown_only:
        for md in mds:
            copy_markdown(md)
        return 0
    warm_font_cache()
    for md in mds:
        refresh(md, args.timeout)
    return 0


if __name__ == "__main__":
    sys.exit(main())

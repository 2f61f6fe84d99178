"""Re-execute chapters from their .md source and store the outputs in the paired .ipynb.

    python -m bookbuild.refresh                   # every chapter in _toc.yml
    python -m bookbuild.refresh 02_speed.md       # one chapter (a name in chapters/ or a path)
    python -m bookbuild.refresh --timeout 0 09_scaling.md   # no limit on a cell (default: 1800 s a cell)
    python -m bookbuild.refresh --markdown-only 08_1_bytes.md   # only prose changed: copy it, run nothing

Run it after editing a chapter's .md (or code/ it imports); nbval then checks the stored outputs.
It stores a page only if the machine was quiet while the page ran: a training step (the calibration) timed
before and after the page, and the page's own calibration line, each at most quiet.FACTOR times this CPU's
quiet figure (bookbuild/quiet.py); otherwise it says so in one sentence, stores nothing and exits 1. There
is no flag to store a busy page anyway: tests/test_quiet.py fails on it all the same. A quiet machine that is
just slower than the one whose pages are stored (the same CPU name and cores) refreshes every page of that CPU
in one run: the pages being refreshed do not count towards the quiet figure, so its own calibration sets it.
The cells tagged `cuda` do not run (their `skip-execution` tag), and keep the outputs a GPU run stored
for them (bookbuild/gpu_run.py) as long as their code is unchanged.
"""
import os
import sys
import time
from pathlib import Path

from . import quiet
from .book import REPO, chapters, script_arguments, warm_font_cache
from .cuda import SKIP_TAG, is_cuda_cell, keep_stored_gpu_outputs

CELL_TIMEOUT_S = 1800  # nbclient's limit on one cell; a loaded machine may need more (--timeout, 0: none)
START_CALIBRATIONS = 3  # the refresh's own calibrations before the first page; the fastest joins the quiet figure


def _measure():
    """code/measure.py (it imports torch), for the calibration step and run_times.json."""
    if str(REPO / "code") not in sys.path:
        sys.path.insert(0, str(REPO / "code"))
    import measure
    return measure


class Gauge:
    """How busy this machine is, against this CPU's quiet figure (bookbuild/quiet.py): the fastest
    calibration of the stored pages made on this CPU, other than those being refreshed (their outputs are
    about to be replaced), and of this refresh's own calibrations, START_CALIBRATIONS of them at its start."""

    def __init__(self, refreshing=(), mds=None):
        _measure()
        import record  # code/record.py: this CPU's name as a page's experiment record states it

        self.cpu = quiet.cpu_of({"CPU": record.cpu_name(), "CPU cores": os.cpu_count()})
        names = {md.stem for md in refreshing}
        stored = {stem: ms for stem, (cpu, ms) in quiet.stored_calibrations(mds).items()
                  if cpu == self.cpu and stem not in names}
        self.last_ms = min(self.measure() for _ in range(START_CALIBRATIONS))
        self.quiet_ms = min([*stored.values(), self.last_ms])
        source = f"the fastest of {len(stored)} stored pages and" if stored else "no stored page of this CPU, only"
        print(f"{self.cpu}: quiet figure {self.quiet_ms:.0f} ms a training step ({source} this refresh's own "
              f"calibration, {self.last_ms:.0f} ms now); a page run above {quiet.FACTOR}× that is not stored",
              flush=True)
        self.check("nothing refreshed", [self.last_ms], "at the start")

    def measure(self) -> float:
        """A training step now, in ms (measure.calibration_step_s, about a second on a quiet machine)."""
        self.last_ms = 1e3 * _measure().calibration_step_s()
        return self.last_ms

    def check(self, lead: str, calibrations_ms: list, when: str) -> None:
        """Refuse (one sentence, exit 1) if any calibration is more than FACTOR times the quiet figure;
        otherwise the fastest of them joins the quiet figure."""
        busiest = max(calibrations_ms)
        if busiest > quiet.FACTOR * self.quiet_ms:
            script_arguments().refuse(
                f"{lead}: the machine was busy {when}: a training step took {busiest:.0f} ms, "
                f"{busiest / self.quiet_ms:.1f} times this CPU's quiet {self.quiet_ms:.0f} ms (the limit is "
                f"{quiet.FACTOR}×), so stop what else is running and refresh it again (on a slower machine, every "
                f"page of this CPU together)")
        self.quiet_ms = min([self.quiet_ms, *calibrations_ms])


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


def refresh(md: Path, gauge: Gauge, timeout: int | None = CELL_TIMEOUT_S) -> None:
    """Execute the chapter and store its outputs, unless the machine was busy before, during or after it:
    the gauge's last calibration, the page's own calibration line and a calibration after it."""
    import nbformat

    before_ms = gauge.last_ms
    t0 = time.perf_counter()
    nb = execute(md, timeout)
    out = md.with_suffix(".ipynb")
    if out.is_file():  # the cuda cells did not run: keep what a GPU run stored
        keep_stored_gpu_outputs(nb, nbformat.read(out, as_version=4))
    seconds = time.perf_counter() - t0
    page_ms = quiet.calibration_ms(nb)
    after_ms = gauge.measure()
    gauge.check(f"{md.name} not stored", [before_ms, after_ms] + [page_ms] * (page_ms is not None), "while it ran")
    tmp = out.with_suffix(".ipynb.tmp")
    nbformat.write(nb, tmp)
    tmp.replace(out)
    record_run_time(md.stem, seconds, after_ms / 1e3)
    calibrated = f", a training step {page_ms:.0f} ms in the page" if page_ms is not None else ""
    print(f"{md.name}: {seconds:.0f} s{calibrated}, {after_ms:.0f} ms after it", flush=True)


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


def record_run_time(chapter: str, seconds: float, step_s: float | None = None) -> None:
    """Store how long the chapter took and how fast a training step was right after it (step_s, the
    refresh's calibration; None: measured now), in chapters/run_times.json: what a chapter's
    estimate_run_time (code/measure.py) scales on a reader's machine."""
    import json

    measure = _measure()
    import record

    step_s = measure.calibration_step_s() if step_s is None else step_s
    times = json.loads(measure.RUN_TIMES.read_text(encoding="utf-8")) if measure.RUN_TIMES.is_file() else {}
    times[chapter] = {"seconds": round(seconds, 1), "step_s": round(step_s, 4), "cpu": record.cpu_name()}
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
    gauge = Gauge(refreshing=mds)
    for md in mds:
        refresh(md, gauge, args.timeout)
    return 0


if __name__ == "__main__":
    sys.exit(main())

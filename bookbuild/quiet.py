"""How busy the machine was when a page's reference outputs were stored, read from the page itself.

Every timing page prints, in its first code cell, how long one training step of the default model took
when it ran (measure.estimate_run_time's line "calibration: one training step takes N ms here"): the
calibration. On a quiet machine it is the CPU's own speed; beside other work it grows with the load.

This CPU's quiet figure is the fastest calibration among the stored pages made on a CPU of the same name
and core count (their experiment record), and, while bookbuild.refresh runs, the fastest of its own
calibrations. It is read from the pages' outputs, never from a file that could be corrected apart from
them (chapters/run_times.json is only the estimate's yardstick). Two machines that print the same name
count as one, and the faster sets the figure: a reference set that mixes them then fails as if loaded.

Not the load average: in a container it is the host's, not the share of the CPU a page gets, while the
calibration measures exactly what the page's timings got.
"""
import re

from . import book

# A page stored at more than this many times its CPU's quiet figure was made on a busy machine. One
# CPU-bound process beside a page on two cores doubles the calibration; the quiet pages stored on one
# machine spread up to 1.4×.
FACTOR = 1.5
CALIBRATION = re.compile(r"calibration: one training step takes (\d+) ms here")


def calibration_ms(nb) -> float | None:
    """The page's calibration (ms a training step), from the first calibration line its outputs printed."""
    for cell in nb.cells:
        for out in cell.get("outputs", []) if cell.cell_type == "code" else []:
            match = CALIBRATION.search(out.get("text", "")) if out.get("output_type") == "stream" else None
            if match:
                return float(match.group(1))
    return None


def cpu_of(record: dict) -> str | None:
    """Which CPU a page's experiment record names: its name and core count (None: no record)."""
    return f"{record['CPU']}，{record.get('CPU cores', '?')} 核" if record.get("CPU") else None


def stored_calibrations(mds=None) -> dict:
    """{chapter stem: (CPU, calibration ms)} of every stored page (.ipynb beside the .md) that has both."""
    import nbformat

    from .provenance import record_of

    found = {}
    for md in book.chapters() if mds is None else mds:
        stored = md.with_suffix(".ipynb")
        if not stored.is_file():
            continue
        nb = nbformat.read(stored, as_version=4)
        cpu, ms = cpu_of(record_of(nb)), calibration_ms(nb)
        if cpu and ms:
            found[md.stem] = (cpu, ms)
    return found


def quiet_figures(calibrations: dict) -> dict:
    """{CPU: its quiet figure}: the fastest calibration stored for each CPU."""
    figures = {}
    for cpu, ms in calibrations.values():
        figures[cpu] = min(ms, figures.get(cpu, ms))
    return figures


def ratios(calibrations: dict) -> dict:
    """{chapter stem: its calibration over its CPU's quiet figure} (1.0: made as fast as this CPU goes)."""
    figures = quiet_figures(calibrations)
    return {stem: ms / figures[cpu] for stem, (cpu, ms) in calibrations.items()}


def calibration_text(stem: str, calibrations: dict) -> str:
    """What the provenance page says of a page's reference outputs: the calibration they were made at."""
    if stem not in calibrations:
        return "存下的参考输出里没有校准行"
    cpu, ms = calibrations[stem]
    quiet = quiet_figures(calibrations)[cpu]
    busy = f"，超过 {FACTOR:g} 倍：当时机器忙，计时不可信" if ms > FACTOR * quiet else ""
    return (f"存参考输出时训练一步 {ms:.0f} ms，是这台 CPU 最快一次（{quiet:.0f} ms）的 {ms / quiet:.1f} 倍"
            f"{busy}")

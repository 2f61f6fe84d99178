"""Reference outputs from a quiet machine (bookbuild/quiet.py), read from what each stored page printed."""
import os
import sys

import jupytext
import nbformat
import pytest

from bookbuild import book, quiet, refresh

sys.path.insert(0, str(book.REPO / "code"))
from test_refresh import CHAPTER as MARKDOWN_CHAPTER  # noqa: E402  (its front matter)

import record  # noqa: E402  (code/: this CPU's name as a page's record states it)


def test_every_stored_page_was_made_on_a_quiet_machine():
    calibrations = quiet.stored_calibrations()
    figures = quiet.quiet_figures(calibrations)
    busy = {stem: ratio for stem, ratio in quiet.ratios(calibrations).items() if ratio > quiet.FACTOR}
    table = "\n".join(f"  {stem}: {calibrations[stem][1]:.0f} ms, {ratio:.1f}× {figures[calibrations[stem][0]]:.0f} ms "
                      f"({calibrations[stem][0]})" for stem, ratio in sorted(busy.items()))
    assert not busy, (f"{len(busy)} stored pages were made more than {quiet.FACTOR}× slower than their CPU's quiet "
                      f"figure: refresh them on a quiet machine (python -m bookbuild.refresh):\n{table}")


@pytest.mark.parametrize("md", book.chapters(), ids=lambda p: p.stem)
def test_a_page_that_estimates_its_run_time_stores_its_calibration_and_cpu(md):
    if "estimate_run_time(" not in md.read_text(encoding="utf-8"):
        pytest.skip("the page prints no calibration")
    assert md.stem in quiet.stored_calibrations([md]), f"{md.with_suffix('.ipynb').name} has no calibration line"


def test_the_quiet_figure_is_the_fastest_page_of_the_same_cpu():
    pages = {"a": ("X，2 核", 150.0), "b": ("X，2 核", 300.0), "c": ("X，4 核", 90.0), "d": ("Y，2 核", 400.0)}
    assert quiet.quiet_figures(pages) == {"X，2 核": 150.0, "X，4 核": 90.0, "Y，2 核": 400.0}
    assert quiet.ratios(pages) == {"a": 1.0, "b": 2.0, "c": 1.0, "d": 1.0}
    assert quiet.calibration_text("a", pages) == "存参考输出时训练一步 150 ms，是这台 CPU 最快一次（150 ms）的 1.0 倍"
    assert quiet.calibration_text("b", pages).endswith("的 2.0 倍，超过 1.5 倍：当时机器忙，计时不可信")
    assert quiet.calibration_text("e", pages) == "存下的参考输出里没有校准行"
    assert quiet.cpu_of({"CPU": "X", "CPU cores": "2"}) == "X，2 核" and quiet.cpu_of({}) is None


CHAPTER = MARKDOWN_CHAPTER[:MARKDOWN_CHAPTER.index("# A page")] + """# A page

```{code-cell} ipython3
print("calibration: one training step takes MS ms here; no stored run of 09_x to scale")
```

```{code-cell} ipython3
print("CPU: NAME")
print("CPU cores: CORES")
# print_record()
```
"""


def page(tmp_path, calibration_ms: float):
    """A chapter 09_x.md whose first cell prints a calibration line, as measure.estimate_run_time does, and
    whose record names this CPU; and its stored .ipynb, made at 1 ms a step."""
    md = tmp_path / "09_x.md"
    text = CHAPTER.replace("NAME", record.cpu_name()).replace("CORES", str(os.cpu_count())).replace(
        "# print_record()", "print_record = lambda: None\nprint_record()")
    md.write_text(text.replace("MS", f"{calibration_ms:.0f}"), encoding="utf-8")
    stored = jupytext.reads(text.replace("MS", "1"), fmt="md:myst")
    code = [cell for cell in stored.cells if cell.cell_type == "code"]
    code[0].outputs = [nbformat.v4.new_output("stream", text="calibration: one training step takes 1 ms here\n")]
    code[1].outputs = [nbformat.v4.new_output("stream", text=f"CPU: {record.cpu_name()}\n"
                                                                    f"CPU cores: {os.cpu_count()}\n")]
    nbformat.write(stored, md.with_suffix(".ipynb"))
    return md


@pytest.fixture
def run_times(monkeypatch, tmp_path):
    measure = refresh._measure()
    monkeypatch.setattr(measure, "RUN_TIMES", tmp_path / "run_times.json")
    return measure.RUN_TIMES


@pytest.mark.slow  # calibrations (a second each, quiet) and a kernel: 40 s on a loaded 2-core machine
def test_the_refresh_stores_nothing_when_the_machine_is_busier_than_the_stored_pages(tmp_path, capsys, run_times):
    md = page(tmp_path, 1)
    before = md.with_suffix(".ipynb").read_bytes()
    with pytest.raises(SystemExit) as e:  # the stored page was made at 1 ms a step: no machine now is that quiet
        refresh.Gauge(mds=[md])
    assert e.value.code == 1 and "nothing refreshed: the machine was busy at the start" in capsys.readouterr().err
    assert md.with_suffix(".ipynb").read_bytes() == before and not run_times.exists()


@pytest.mark.slow  # calibrations (a second each, quiet) and a kernel: 40 s on a loaded 2-core machine
def test_the_refresh_stores_nothing_when_the_page_itself_ran_busy(tmp_path, capsys, run_times):
    md = page(tmp_path, 1e6)  # the page's own calibration: a step took 1,000 s
    before = md.with_suffix(".ipynb").read_bytes()
    gauge = refresh.Gauge(refreshing=[md], mds=[md])  # the page is being replaced: its 1 ms is not this CPU's figure
    with pytest.raises(SystemExit) as e:
        refresh.refresh(md, gauge, timeout=120)
    err = capsys.readouterr().err
    assert e.value.code == 1 and "09_x.md not stored: the machine was busy while it ran" in err, err
    assert err.count("\n") == 1 and md.with_suffix(".ipynb").read_bytes() == before and not run_times.exists()


@pytest.mark.slow  # calibrations (a second each, quiet) and a kernel: 40 s on a loaded 2-core machine
def test_the_refresh_stores_a_page_run_within_the_factor(tmp_path, monkeypatch, run_times):
    md = page(tmp_path, 5)
    monkeypatch.setattr(quiet, "FACTOR", 1e6)  # this shared test machine is never quiet: the store path only
    gauge = refresh.Gauge(refreshing=[md], mds=[md])
    refresh.refresh(md, gauge, timeout=120)
    assert quiet.stored_calibrations([md]) == {"09_x": (quiet.cpu_of({"CPU": record.cpu_name(),
                                                                      "CPU cores": os.cpu_count()}), 5.0)}
    assert "09_x" in run_times.read_text() and gauge.quiet_ms == 5.0

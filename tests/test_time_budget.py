"""The book in its time: the pages' stored run times (chapters/run_times.json, which bookbuild.refresh
writes on a machine its quiet check accepts) fit the time the book allows itself, so that a new page or
figure that would push the build past it fails here, before it lands.

The ceilings are the decisions of the speed issue, on 2 idle cores of the machine that stored the
references: every page at most PAGE_S, chapter 9's first page (the experiment its four pages share) at
most EXPERIMENT_S, and the chapters together at most CHAPTERS_S, what a cold build spends in them within
its 17 minutes (the rest: Sphinx, the search index, the calculator's Pyodide)."""
import json
from pathlib import Path

from bookbuild import book

RUN_TIMES = Path(__file__).resolve().parent.parent / "chapters" / "run_times.json"
PAGE_S = 90
EXPERIMENT = "09_scaling"
EXPERIMENT_S = 330  # 5.5 minutes
CHAPTERS_S = 16.5 * 60


def stored() -> dict:
    return json.loads(RUN_TIMES.read_text(encoding="utf-8"))


def test_every_page_has_a_stored_run_time():
    missing = [md.stem for md in book.chapters() if md.stem not in stored()]
    assert not missing, f"pages with no stored run time (run python -m bookbuild.refresh on them): {missing}"


def test_every_page_fits_its_ceiling():
    over = {page: t["seconds"] for page, t in stored().items()
            if t["seconds"] > (EXPERIMENT_S if page == EXPERIMENT else PAGE_S)}
    assert not over, f"pages over {PAGE_S} s ({EXPERIMENT} over {EXPERIMENT_S} s): {over}"


def test_the_chapters_fit_the_builds_time():
    times = stored()
    total = sum(times[md.stem]["seconds"] for md in book.chapters() if md.stem in times)
    assert total <= CHAPTERS_S, (f"the pages take {total:.0f} s together, over the {CHAPTERS_S:.0f} s a cold build "
                                 "may spend in them; make a page cheaper before adding one")

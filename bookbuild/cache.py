"""The build's execution cache: each page keyed on what it can see, and how a chapter that nbval ran gets in.

Jupyter Book's cache matches a page on its own code cells only. A page's key here adds the files its
execution can read (reads.py: the code/ modules it imports, to the end, the scripts it starts and what
they import, the data files, requirements.txt, _config.yml, its entry in chapters/run_times.json), and
execution_cache() drops a cached execution only when its page's key changed: a change to
code/train_gpu.py re-executes the pages that can see it, and no other. After each execution the files
the page's kernel and its processes loaded must be inside the key (reads.unseen); else the build and
nbval fail, naming the file.

The tests fill the same cache: every chapter that nbval ran and found equal to its reference outputs is
stored with the outputs nbval produced (nbval_hooks.py), under the key the build looks it up by (the
chapter's code cells as the build reads them, and its page key). So `pytest` followed by a build
executes each chapter once, and the book shows the very outputs the tests checked. nbval itself skips a
page whose key, reference outputs and sanitizer are those of a run that passed when BOOK_NBVAL_CHANGED_ONLY=1.

    python -m bookbuild.cache --map     # the page-to-files map the static reading gives, and what the
                                        # last traced run of each page loaded (the run-time check)
"""
import copy
import hashlib
import json
import os
import sys
from functools import lru_cache
from pathlib import Path

from . import reads
from .book import REPO, pages, script_arguments

BUILD = REPO / "_build"
STAMP = BUILD / ".inputs-hash"                 # inputs_hash() of the last successful HTML build
BUILT_KEYS = BUILD / ".built-page-keys.json"   # {docname: page key} the last successful HTML build read
CACHE = BUILD / ".jupyter_cache"               # Jupyter Book's execution cache (the default path)
CACHE_KEYS = BUILD / ".cache-page-keys.json"   # {cache record id: page key it was executed with}
READS = BUILD / "reads"                        # what each page's execution loaded, one log per page
NBVAL_PASSED = BUILD / ".nbval-passed.json"    # {page: nbval_key} of its last run that passed
SANITIZE = REPO / "tests" / "nbval_sanitize.cfg"


@lru_cache(maxsize=None)
def _file_digest(path: Path, mtime_ns: int, size: int) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def file_digest(path: Path) -> str:
    if not path.is_file():
        return "absent"
    st = path.stat()
    return _file_digest(path, st.st_mtime_ns, st.st_size)


def page_key(md: Path) -> str:
    """What a page's outputs depend on besides its own cells (which the cache matches on itself)."""
    h = hashlib.sha256()
    for name in reads.page_files(md):
        h.update(f"{name}\0{file_digest(REPO / name)}\n".encode())
    h.update(f"{reads.RUN_TIMES}[{md.stem}]\0{reads.run_times_entry(md)}".encode())
    return h.hexdigest()


def page_keys() -> dict:
    """{page's .md: its key} for every page of the book."""
    return {md: page_key(md) for md in pages()}


def inputs_hash(keys: dict | None = None) -> str:
    """The whole book's inputs besides the pages' cells: one digest of every page's key."""
    keys = page_keys() if keys is None else keys
    return hashlib.sha256(json.dumps({str(md): k for md, k in keys.items()}, sort_keys=True).encode()).hexdigest()


def nbval_key(md: Path) -> str:
    """What nbval's verdict on a page depends on: its key, its paired .ipynb (the cells nbval runs and the
    reference outputs) and the sanitizer."""
    return hashlib.sha256("".join([page_key(md), file_digest(md.with_suffix(".ipynb")),
                                   file_digest(SANITIZE)]).encode()).hexdigest()


def load(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def save(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=0, sort_keys=True), encoding="utf-8")


def execution_cache(keys: dict | None = None):
    """The book's jupyter-cache, without the executions whose page's key changed since they were made
    (or that carry no key: a cache from before page keys, an execution this build could not check)."""
    from jupyter_cache import get_cache
    keys = page_keys() if keys is None else keys
    by_uri = {str(md): k for md, k in keys.items()}
    store = get_cache(str(CACHE))
    stamps = load(CACHE_KEYS)
    for record in store.list_cache_records():
        if stamps.get(str(record.pk)) != by_uri.get(record.uri) or record.uri not in by_uri:
            store.remove_cache(record.pk)
            stamps.pop(str(record.pk), None)
    kept = {str(r.pk) for r in store.list_cache_records()}
    save(CACHE_KEYS, {pk: k for pk, k in stamps.items() if pk in kept})
    return store


def stamp(pk: int, key: str) -> None:
    stamps = load(CACHE_KEYS)
    stamps[str(pk)] = key
    save(CACHE_KEYS, stamps)


def check_executions(keys_before: dict) -> list[str]:
    """After a build: keep each execution it added to the cache, under its page's key, when the key did not
    change while the page ran and the page loaded nothing outside it; remove the others. Returns why the
    build fails: a page that loaded a file outside its key, or one executed without the run-time trace."""
    from jupyter_cache import get_cache
    store = get_cache(str(CACHE))
    stamps, failures = load(CACHE_KEYS), []
    for record in store.list_cache_records():
        if str(record.pk) in stamps:
            continue  # execution_cache() left only stamped records before the build
        md = Path(record.uri)
        failure = reads.verdict(md, READS / f"{md.stem}.log") if md in keys_before else ""
        if failure:
            failures.append(failure)
        if failure or md not in keys_before or page_key(md) != keys_before[md]:
            store.remove_cache(record.pk)
        else:
            stamp(record.pk, keys_before[md])
    return failures


def run_jupyter_book(cmd: list, keys: dict, reread=()) -> int:
    """Run a Jupyter Book build (`cmd`) over the cache of these page keys: the pages `reread` are read
    again, each page executed is traced, and the build fails (non-zero) when one loaded a file outside
    its key (check_executions)."""
    import subprocess
    execution_cache(keys)  # each page read starts its log afresh (reads.traced_env); nbval's logs stay
    env = {**os.environ, reads.REREAD_VAR: "\n".join(reread), reads.TRACE_DIR_VAR: str(READS)}
    rc = subprocess.run(cmd, cwd=REPO, env=env).returncode
    failures = check_executions(keys)
    for failure in failures:
        print(f"FAILED: {failure}", file=sys.stderr)
    return rc or (1 if failures else 0)


def as_the_build_reads(md: Path):
    """The notebook myst-nb makes of a chapter's .md in a build: the execution cache matches on its
    code cells' source and metadata (the source-read hook adds Markdown only)."""
    from myst_nb.core.read import read_myst_markdown_notebook
    return read_myst_markdown_notebook(md.read_text(encoding="utf-8"))


def executed_notebook(run, nb):
    """`nb` (a chapter as the build reads it) with each code cell's outputs from an nbval run, or None
    when some cell failed or did not run, or the cells differ from the ones nbval ran. `run` holds the
    notebook nbval ran ("nb"), the outputs of each cell that passed by id(cell) ("outputs") and
    whether a cell failed ("failed")."""
    nb = copy.deepcopy(nb)
    ran = [c for c in run["nb"].cells if c.cell_type == "code"]
    code = [c for c in nb.cells if c.cell_type == "code"]
    if run["failed"] or len(ran) != len(code):
        return None
    for count, (ref_cell, cell) in enumerate(zip(ran, code), start=1):
        if id(ref_cell) not in run["outputs"] or ref_cell.source != cell.source:
            return None
        cell.outputs = copy.deepcopy(run["outputs"][id(ref_cell)])
        cell.execution_count = count
        for out in cell.outputs:
            if out.get("output_type") == "execute_result":
                out["execution_count"] = count
    return nb


def store(md: Path, nb, key: str, seconds: float) -> None:
    """Put an executed chapter in the build's execution cache, filed under the chapter's .md and its key."""
    from jupyter_cache import get_cache
    from jupyter_cache.base import CacheBundleIn
    record = get_cache(str(CACHE)).cache_notebook_bundle(
        CacheBundleIn(nb, str(md), data={"execution_seconds": seconds, "executed_by": "nbval"}),
        check_validity=False, overwrite=True)
    stamp(record.pk, key)


def record_nbval(md: Path, key: str | None) -> None:
    """Note that nbval passed on the page with this nbval_key (None: forget a pass, the page failed)."""
    passed = load(NBVAL_PASSED)
    if key is None:
        passed.pop(md.stem, None)
    else:
        passed[md.stem] = key
    save(NBVAL_PASSED, passed)


def nbval_passed(md: Path) -> bool:
    """Whether nbval passed on the page as it is now: its nbval_key unchanged since a run that passed."""
    return load(NBVAL_PASSED).get(md.stem) == nbval_key(md)


def main(argv=None) -> int:
    ap = script_arguments().Parser(prog="python -m bookbuild.cache", description="The execution cache's page keys.")
    ap.add_argument("--map", action="store_true", help="print the files each page's key covers (the static "
                    "reading) and, for each page traced since, what it loaded")
    args = ap.parse_args(argv)
    if args.map:
        reads.print_map(READS)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Build the book to _build/html, executing every chapter whose outputs could be stale.

    python -m bookbuild.build            # build; re-executes what changed
    python -m bookbuild.build --strict   # warnings are errors, a failing cell fails the build (CI)

The execution cache is emptied when the inputs under code/ or data/ changed since it was filled
(cache.py); when they changed since the last build, every page is re-read. A page whose chapter is in
the cache, executed by an earlier build or handed over by nbval, is not executed again.
"""
import subprocess
import sys
import time
from pathlib import Path

from .book import REPO, script_arguments, warm_font_cache
from .cache import STAMP, execution_cache, inputs_hash


def main(argv=None) -> int:
    ap = script_arguments().Parser(prog="python -m bookbuild.build", description="Build the book to _build/html.")
    ap.add_argument("--strict", action="store_true", help="treat warnings as errors")
    args = ap.parse_args(argv)
    warm_font_cache()
    digest = inputs_hash()
    stale = not STAMP.is_file() or STAMP.read_text() != digest
    cmd = [str(Path(sys.executable).parent / "jupyter-book"), "build", str(REPO)]
    execution_cache(digest)
    if stale:
        cmd.append("--all")
    if args.strict:
        cmd += ["-W", "-n", "--keep-going"]
    print(("inputs changed: re-reading every page" if stale else "inputs unchanged: re-reading only "
           "edited pages") + "; chapters not in the execution cache are executed", flush=True)
    t0 = time.perf_counter()
    rc = subprocess.run(cmd, cwd=REPO).returncode
    if rc == 0:
        STAMP.write_text(digest)
    print(f"build {'succeeded' if rc == 0 else 'FAILED'} in {time.perf_counter() - t0:.0f} s")
    return rc


if __name__ == "__main__":
    sys.exit(main())

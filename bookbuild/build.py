"""Build the book to _build/html, executing every chapter whose outputs could be stale.

    python -m bookbuild.build            # build; re-executes what changed
    python -m bookbuild.build --strict   # warnings are errors, a failing cell fails the build (CI)

A page is executed again when its own cells or its key changed (cache.py: the files its execution can
read), and read again when its source or its key changed since the last build; the others keep their
outputs. A page in the execution cache, executed by an earlier build or handed over by nbval, is not
executed again. Each page executed here is traced, and the build fails when it loaded a code/ file its
key does not cover (reads.py).
"""
import sys
import time
from pathlib import Path

from . import cache
from .book import REPO, docname, script_arguments, warm_font_cache


def main(argv=None) -> int:
    ap = script_arguments().Parser(prog="python -m bookbuild.build", description="Build the book to _build/html.")
    ap.add_argument("--strict", action="store_true", help="treat warnings as errors")
    args = ap.parse_args(argv)
    warm_font_cache()
    keys = cache.page_keys()
    built = cache.load(cache.BUILT_KEYS)
    reread = [docname(md) for md, key in keys.items() if built.get(docname(md)) != key]
    cmd = [str(Path(sys.executable).parent / "jupyter-book"), "build", str(REPO)]
    if not built:
        cmd.append("--all")
    if args.strict:
        cmd += ["-W", "-n", "--keep-going"]
    names = " ".join(Path(d).name for d in reread)
    print(f"inputs changed for {len(reread)} of {len(keys)} pages, read again: {names}" if reread else
          "inputs unchanged: re-reading only edited pages", flush=True)
    t0 = time.perf_counter()
    rc = cache.run_jupyter_book(cmd, keys, reread)
    if rc == 0:
        cache.save(cache.BUILT_KEYS, {docname(md): key for md, key in keys.items()})
        cache.STAMP.write_text(cache.inputs_hash(keys))
    print(f"build {'succeeded' if rc == 0 else 'FAILED'} in {time.perf_counter() - t0:.0f} s")
    return rc


if __name__ == "__main__":
    sys.exit(main())

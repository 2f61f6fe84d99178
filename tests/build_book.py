"""Build the book to HTML, executing every chapter whose outputs could be stale.

    python tests/build_book.py            # build; re-executes what changed
    python tests/build_book.py --strict   # warnings are errors (what CI runs)

Jupyter Book's cache keys a chapter on its own code cells only, so a change under code/ or data/
would leave stale outputs. This script hashes those inputs and, when they changed since the
execution cache was filled, empties the cache; when they changed since the last build, it re-reads
every page. A page whose chapter is in the cache is not executed again.

The cache is filled by the build itself and also by the test suite: every chapter that nbval ran
and found equal to its reference outputs is stored with the outputs nbval produced
(chapters/conftest.py). So `pytest` followed by a build executes each chapter once, and the book
shows the very outputs the tests checked.
"""
import argparse
import hashlib
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BUILD = REPO / "_build"
STAMP = BUILD / ".inputs-hash"                # inputs of the last successful HTML build
CACHE = BUILD / ".jupyter_cache"               # Jupyter Book's execution cache (the default path)
CACHE_STAMP = BUILD / ".cache-inputs-hash"     # inputs the cached executions were made with


def inputs_hash() -> str:
    h = hashlib.sha256()
    for path in sorted([*(REPO / "code").glob("*.py"), REPO / "data" / "songci.txt",
                        REPO / "requirements.txt", REPO / "_config.yml"]):
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def execution_cache(digest: str):
    """The book's jupyter-cache, emptied first if it was filled with other inputs."""
    from jupyter_cache import get_cache
    if not CACHE_STAMP.is_file() or CACHE_STAMP.read_text() != digest:
        shutil.rmtree(CACHE, ignore_errors=True)
        BUILD.mkdir(exist_ok=True)
        CACHE_STAMP.write_text(digest)
    return get_cache(str(CACHE))


def main() -> int:
    ap = argparse.ArgumentParser(description="Build the book to _build/html.")
    ap.add_argument("--strict", action="store_true", help="treat warnings as errors")
    args = ap.parse_args()
    import matplotlib.font_manager  # noqa: F401  (build the font cache here, not in a chapter's output)
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

"""Build the book to HTML, executing every chapter whose outputs could be stale.

    python tests/build_book.py            # build; re-executes what changed
    python tests/build_book.py --strict   # warnings are errors (what CI runs)

Jupyter Book's cache keys a chapter on its own code cells only, so a change under code/ or data/
would leave stale outputs. This script hashes those inputs and, when they changed since the last
build, empties the execution cache and re-reads every page.
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
STAMP = BUILD / ".inputs-hash"


def inputs_hash() -> str:
    h = hashlib.sha256()
    for path in sorted([*(REPO / "code").glob("*.py"), REPO / "data" / "songci.txt",
                        REPO / "requirements.txt", REPO / "_config.yml"]):
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def main() -> int:
    ap = argparse.ArgumentParser(description="Build the book to _build/html.")
    ap.add_argument("--strict", action="store_true", help="treat warnings as errors")
    args = ap.parse_args()
    import matplotlib.font_manager  # noqa: F401  (build the font cache here, not in a chapter's output)
    digest = inputs_hash()
    stale = not STAMP.is_file() or STAMP.read_text() != digest
    cmd = [str(Path(sys.executable).parent / "jupyter-book"), "build", str(REPO)]
    if stale:
        shutil.rmtree(BUILD / ".jupyter_cache", ignore_errors=True)
        cmd.append("--all")
    if args.strict:
        cmd += ["-W", "-n", "--keep-going"]
    print(("inputs changed: re-executing every chapter" if stale else "inputs unchanged: "
           "re-executing only edited chapters"), flush=True)
    t0 = time.perf_counter()
    rc = subprocess.run(cmd, cwd=REPO).returncode
    if rc == 0:
        STAMP.write_text(digest)
    print(f"build {'succeeded' if rc == 0 else 'FAILED'} in {time.perf_counter() - t0:.0f} s")
    return rc


if __name__ == "__main__":
    sys.exit(main())

"""Imported by every Python process started with this folder on PYTHONPATH (bookbuild/reads.py's
traced_env: a page's kernel in the build or under nbval, and what the kernel starts, which inherits the
environment). With BOOK_READS_LOG set, it appends to that file each file of the book's code/ and data/
(not data/cache/) the process opens to read, imports included (a cached import opens its .pyc, named here by its
.py), once per file and at once, so a process killed later has still logged what it loaded. An audit hook
sees every open: no import path escapes it. It costs a comparison per audited event (about 26,000
in the imports of a page, 0.2-1 µs each: some 10 ms a process)."""
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
_REPO = os.path.dirname(os.path.dirname(_HERE))
_ROOTS = (os.path.join(_REPO, "code") + os.sep, os.path.join(_REPO, "data") + os.sep)
_SKIP = os.path.join(_REPO, "data", "cache") + os.sep
_LOG = os.environ.get("BOOK_READS_LOG")


def _logged():
    seen = set()  # what this process has logged

    def hook(event, args):
        if event != "open" or isinstance(args[0], int) or _writes(args):
            return
        path = os.fsdecode(args[0])
        if not path.startswith(_ROOTS):
            if os.path.isabs(path) or not path:
                return
            path = os.path.abspath(path)
            if not path.startswith(_ROOTS):
                return
        if path in seen or path.startswith(_SKIP):
            return
        seen.add(path)
        folder, name = os.path.split(path)
        if os.path.basename(folder) == "__pycache__":  # code/__pycache__/model.cpython-311.pyc: model.py
            folder, name = os.path.dirname(folder), name.split(".")[0] + ".py"
        rel = os.path.relpath(os.path.join(folder, name), _REPO).replace(os.sep, "/")
        fd = os.open(_LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (rel + "\n").encode())
        finally:
            os.close(fd)
    return hook


def _writes(args) -> bool:
    """Whether an open is for writing only (an output, not something the page reads): open()'s mode, or
    os.open()'s flags."""
    mode, flags = args[1], args[2]
    if isinstance(mode, str):
        return any(c in mode for c in "wax") and "+" not in mode
    return isinstance(flags, int) and flags & os.O_ACCMODE == os.O_WRONLY


if _LOG:
    sys.addaudithook(_logged())

# This folder holds only this file: take it off the path, and run the sitecustomize it hides, if any.
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]


def _run_hidden():
    from importlib.machinery import PathFinder
    from importlib.util import module_from_spec
    spec = PathFinder.find_spec("sitecustomize", sys.path)
    if spec is not None:
        spec.loader.exec_module(module_from_spec(spec))


_run_hidden()

"""What a page's execution can read: the files its cache key covers (cache.py), read statically, and the
code/ files it was seen to load, checked against them after every execution.

Statically (page_files): the page's code cells and every module of code/ they import, followed to the end
(imports inside functions included), the scripts they start (any string
naming a code/ file, `CODE / "train_gpu.py"`, as run_script and `torch.distributed.run` take it) and
what those import; the data files named in any of them (`"songci.txt"`); requirements.txt and
_config.yml; and the page's own entry in chapters/run_times.json (measure.estimate_run_time reads it).

At run time (traced_env): the build and nbval start each page's kernel with trace/ on PYTHONPATH and
BOOK_READS_LOG naming a file; trace/sitecustomize.py then appends every code/ and data/ file that the
kernel, and every process it starts (they inherit the environment), opens. unseen() is what the page
loaded that its key does not cover: a dynamic import the static reading missed, so its page would be kept
stale; the build and nbval fail naming it. A reader running a notebook sets neither variable: nothing is
traced.

    python -m bookbuild.cache --map     # the page-to-files map
"""
import ast
import json
import os
import re
from functools import lru_cache
from pathlib import Path

from .book import REPO, chapters

CODE = REPO / "code"
DATA = REPO / "data"
ALWAYS = ("requirements.txt", "_config.yml")
RUN_TIMES = "chapters/run_times.json"     # a page's key holds its own entry only: a refresh writes the others
TRACE_DIR = Path(__file__).resolve().parent / "trace"
LOG_VAR = "BOOK_READS_LOG"
_FILE_NAME = re.compile(r"(?:[\w.-]*/)*([\w.-]+)")  # a path without spaces: a file name, not prose


def code_cells(md: Path) -> list[str]:
    """The source of a page's code cells, as the build reads its .md."""
    return list(_code_cells(md, md.stat().st_mtime_ns))


@lru_cache(maxsize=None)
def _code_cells(md: Path, mtime_ns: int) -> tuple:
    from .cache import as_the_build_reads
    return tuple(c.source for c in as_the_build_reads(md).cells if c.cell_type == "code")


_RUNS_CODE = re.compile(r"(\s*)%{1,2}(?:time|timeit|prun)\b(?:\s+-\S+)*\s*")  # magics whose rest is Python


def _python(source: str) -> str:
    """A cell's source as ast can read it: `%time import a` is `import a`, other magics and shell lines
    are comments."""
    lines = [_RUNS_CODE.sub(r"\1", line, count=1) if _RUNS_CODE.match(line) else line for line in source.splitlines()]
    return "\n".join("#" + line if line.lstrip().startswith(("%", "!")) else line for line in lines)


def named(text: str, code: Path = CODE, data: Path = DATA) -> tuple[set, set]:
    """(modules of `code` that Python `text` imports, anywhere in it; files of `code` and `data` that a
    string in it names, such as a script it starts)."""
    modules, files = set(), set()
    for node in ast.walk(ast.parse(text)):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module] if (
            isinstance(node, ast.ImportFrom) and node.module and not node.level) else []
        modules |= {n.split(".")[0] for n in names if (code / f"{n.split('.')[0]}.py").is_file()}
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and _FILE_NAME.fullmatch(node.value):
            name = _FILE_NAME.fullmatch(node.value).group(1)
            files |= {p for p in (code / name, data / name) if p.is_file() and (p.parent == data or p.suffix == ".py")}
    return modules, files


@lru_cache(maxsize=None)
def _named_in_file(path: Path, mtime_ns: int) -> tuple[set, set]:
    return named(path.read_text(encoding="utf-8"), path.parent, path.parent.parent / "data")


def closure(texts, code: Path = CODE, data: Path = DATA) -> set:
    """Every file of `code` and `data` that the Python `texts` (a page's cells) import or name, with
    what those files of `code` import and the data files they name, to the end. A string in code/
    naming a script is not a start of it (budget.py prints `code/train_gpu.py` in a command); a script
    that starts another would show in the run-time check."""
    seen = set()
    todo = [named(_python(t), code, data) for t in texts]
    while todo:
        modules, files = todo.pop()
        for path in {code / f"{m}.py" for m in modules} | files:
            if path not in seen:
                seen.add(path)
                if path.suffix == ".py" and path.parent == code:
                    mods, named_files = _named_in_file(path, path.stat().st_mtime_ns)
                    todo.append((mods, {f for f in named_files if f.parent == data}))
    return seen


def page_files(md: Path) -> list[str]:
    """The files a page's execution can read, relative to the repository (its cache key's inputs)."""
    found = closure(code_cells(md))
    return sorted({*(p.relative_to(REPO).as_posix() for p in found), *ALWAYS})


def run_times_entry(md: Path) -> str:
    """The page's own entry in chapters/run_times.json, as its key holds it."""
    path = REPO / RUN_TIMES
    stored = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    return json.dumps(stored.get(md.stem), sort_keys=True)


# ---- at run time ----

def traced_env(log: Path) -> dict:
    """The environment variables under which a kernel, and what it starts, log the files they load to `log`."""
    log.parent.mkdir(parents=True, exist_ok=True)
    log.unlink(missing_ok=True)
    path = os.environ.get("PYTHONPATH")
    return {"PYTHONPATH": os.pathsep.join([str(TRACE_DIR), *([path] if path else [])]), LOG_VAR: str(log)}


class Traced:
    """Within `with Traced(log):`, os.environ is traced_env(log): for a kernel started there."""

    def __init__(self, log: Path):
        self.env, self.saved = traced_env(log), {}

    def __enter__(self):
        self.saved = {k: os.environ.get(k) for k in self.env}
        os.environ.update(self.env)

    def __exit__(self, *exc):
        for k, v in self.saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def loaded(log: Path) -> set:
    """The repository files (relative paths) that the traced processes opened, from their log."""
    return set(log.read_text(encoding="utf-8").split()) if log.is_file() else set()


def unseen(md: Path, log: Path) -> list[str]:
    """The code/ and data/ files a page's execution loaded that its key does not cover."""
    return sorted(loaded(log) - set(page_files(md)))


def shown(md: Path) -> str:
    """A page's path as a message names it: from the repository root when it is in the book."""
    return md.relative_to(REPO).as_posix() if md.is_relative_to(REPO) else str(md)


def verdict(md: Path, log: Path) -> str:
    """Why a page's execution cannot be kept ('' when it can): it loaded files outside its key, or it
    left no trace (the kernel was not started under traced_env, so nothing can vouch for its key)."""
    if not log.is_file():
        return f"{shown(md)} was executed without the run-time trace of what it loads ({LOG_VAR} unset)"
    files = unseen(md, log)
    if not files:
        return ""
    return (f"{shown(md)} loaded {', '.join(files)}, which its cache key does not cover "
            f"(bookbuild/reads.py's static reading missed {'it' if len(files) == 1 else 'them'}): "
            f"import it by name, or name the file in a string, so that a change to it re-executes the page")


def print_map(traced: Path | None = None) -> None:
    """The page-to-files map (python -m bookbuild.cache --map); with `traced`, the folder of the last
    traced runs' logs, what each page was seen to load and whether it all lies inside its key."""
    for md in chapters():
        files = page_files(md)
        code = [f.removeprefix("code/") for f in files if f.startswith("code/")]
        other = [f for f in files if not f.startswith("code/")]
        print(f"{md.stem:18s} {len(code):2d} code/: {' '.join(code)}")
        print(f"{'':18s}    and: {' '.join(other)}, {RUN_TIMES}[{md.stem}]")
        log = traced / f"{md.stem}.log" if traced else None
        if log is not None and log.is_file():
            seen = sorted(f.removeprefix("code/") for f in loaded(log) if f.startswith("code/"))
            print(f"{'':18s} traced: {len(seen)} code/ files loaded ({' '.join(seen)}): "
                  + (verdict(md, log) or "all inside the key"))


# ---- in a build (sphinx_ext.py connects these) ----

REREAD_VAR = "BOOK_REREAD"      # build.py: the pages whose key changed since the last build, one a line
TRACE_DIR_VAR = "BOOK_READS_DIR"  # build.py: trace each executed page into this folder
_tracing = []  # the page being read, traced


def pages_to_reread(app, env, added, changed, removed):
    """env-get-outdated: the pages whose key changed are read again (Sphinx sees only their source)."""
    return [doc for doc in os.environ.get(REREAD_VAR, "").split() if doc in env.found_docs]


def trace_page(app, docname, source):
    """source-read: a kernel that myst-nb starts for this page logs what it loads."""
    if os.environ.get(TRACE_DIR_VAR):
        _tracing.append(Traced(Path(os.environ[TRACE_DIR_VAR]) / f"{Path(docname).name}.log"))
        _tracing[-1].__enter__()


def untrace_page(app, doctree):
    """doctree-read: the page is parsed (and executed, if it was not in the cache): stop tracing."""
    while _tracing:
        _tracing.pop().__exit__()


def setup(app):
    app.connect("env-get-outdated", pages_to_reread)
    app.connect("source-read", trace_page)
    app.connect("doctree-read", untrace_page)

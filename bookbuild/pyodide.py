"""Chapter 12's calculator: the Pyodide runtime and the very code/budget.py, served from the book's _static.

The calculator runs code/budget.py itself in the reader's browser (Pyodide: CPython compiled to
WebAssembly), so the page and the command line cannot disagree. Nothing comes from a CDN:

- the Pyodide runtime is the npm package `pyodide` at VERSION, fetched once with `npm pack`, checked
  against INTEGRITY (npm's sha512) and cached under _build/pyodide/ (outside git); only its core files
  (RUNTIME) go to _static/pyodide/;
- budget.py and the modules of code/ it imports are copied from code/ at every build to
  _static/calculator/code/, listed with the Pyodide version in _static/calculator/manifest.json.

Without npm or without network the build logs one warning (a strict build fails) and the manifest
says why; the page then shows that sentence instead of the calculator. sphinx_ext.py calls setup().
"""
import ast
import base64
import hashlib
import json
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

from .book import REPO

VERSION = "314.0.7"  # Python 3.14
INTEGRITY = "sha512-0YvXxEhfEdpLfb/XkM2BFAeMROq0iMUX2bzzH9pOttyMcWkwq+HbE5uyuGD82LN7y2q+SNvi/6V5JEsOlD2R1A=="
RUNTIME = ("pyodide.mjs", "pyodide.asm.mjs", "pyodide.asm.wasm", "python_stdlib.zip", "pyodide-lock.json")
CODE = REPO / "code"
ENTRY = "budget.py"
CACHE = REPO / "_build" / "pyodide" / VERSION      # the verified runtime files, reused by later builds
STAGE = REPO / "_build" / "calculator-static"       # what the build adds to html_static_path
MARK = 'id="budget-calculator"'                    # the element calculator.js fills, in a page's raw HTML


class Unavailable(Exception):
    """The runtime could not be fetched or verified; the message is one sentence for the reader."""


def integrity(data: bytes) -> str:
    return "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode()


def runtime(cache: Path = CACHE) -> Path:
    """The folder holding the verified core runtime files: from the cache, or fetched with npm."""
    stamp = cache / "integrity"
    if stamp.is_file() and stamp.read_text() == INTEGRITY and all((cache / f).is_file() for f in RUNTIME):
        return cache
    npm = shutil.which("npm")
    if npm is None:
        raise Unavailable(f"npm is not installed, so the build cannot fetch Pyodide {VERSION} "
                          "(apt-get install npm, then build again)")
    with tempfile.TemporaryDirectory() as tmp:
        try:  # --prefer-offline: npm's own cache first, the registry only when the tarball is not there
            r = subprocess.run([npm, "pack", f"pyodide@{VERSION}", "--json", "--prefer-offline",
                                "--fetch-retries=1", "--pack-destination", tmp],
                               capture_output=True, text=True, timeout=600)
        except subprocess.TimeoutExpired:
            r = None
        tarballs = list(Path(tmp).glob("*.tgz"))
        if r is None or r.returncode != 0 or len(tarballs) != 1:
            raise Unavailable(f"npm pack pyodide@{VERSION} failed (no network, or no access to the npm "
                              "registry?), so the build has no Pyodide")
        data = tarballs[0].read_bytes()
        if integrity(data) != INTEGRITY:
            raise Unavailable(f"the pyodide@{VERSION} tarball npm fetched does not match the pinned "
                              "integrity in bookbuild/pyodide.py; refusing to serve it")
        if cache.exists():
            shutil.rmtree(cache)
        cache.mkdir(parents=True)
        with tarfile.open(tarballs[0]) as tar:
            for name in RUNTIME:  # only the core files, by exact name: nothing else leaves the tarball
                try:
                    member = tar.getmember(f"package/{name}")
                except KeyError:
                    raise Unavailable(f"pyodide@{VERSION} has no {name}; bookbuild/pyodide.py's RUNTIME "
                                      "names a file this version does not ship") from None
                (cache / name).write_bytes(tar.extractfile(member).read())
    stamp.write_text(INTEGRITY)
    return cache


def modules(entry: str = ENTRY, code: Path = CODE) -> list[str]:
    """budget.py and every module of code/ that importing it imports, directly or not. Imports inside
    functions are left out (memory.trace_saved_bytes imports torch and model.py only when called); a
    module that is not a file of code/ comes from Pyodide's standard library."""
    def imported(node):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            return
        if isinstance(node, ast.Import):
            yield from (a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            yield node.module.split(".")[0]
        for child in ast.iter_child_nodes(node):
            yield from imported(child)

    found, todo = [], [entry]
    while todo:
        name = todo.pop()
        if name not in found:
            found.append(name)
            tree = ast.parse((code / name).read_text(encoding="utf-8"))
            todo += [f"{m}.py" for m in imported(tree) if (code / f"{m}.py").is_file()]
    return sorted(found)


def stage(stage_dir: Path = STAGE) -> str | None:
    """Fill stage_dir with _static's calculator files; return None, or why the calculator is unavailable."""
    if stage_dir.exists():
        shutil.rmtree(stage_dir)
    code_dir = stage_dir / "calculator" / "code"
    code_dir.mkdir(parents=True)
    names = modules()
    for name in names:
        shutil.copy2(CODE / name, code_dir / name)
    manifest = dict(pyodide=VERSION, entry=ENTRY, modules=names, available=True, reason="")
    try:
        source = runtime()
    except Unavailable as e:
        manifest.update(available=False, reason=str(e))
    else:
        (stage_dir / "pyodide").mkdir()
        for name in RUNTIME:
            shutil.copy2(source / name, stage_dir / "pyodide" / name)
    (stage_dir / "calculator" / "manifest.json").write_text(json.dumps(manifest, indent=1), encoding="utf-8")
    return manifest["reason"] or None


def add_static_files(app):
    """builder-inited: stage the calculator's files and add them to the HTML's static files."""
    if app.builder.format != "html" or not (CODE / ENTRY).is_file():
        return  # not HTML, or a partial copy of the book without code/ (tests build such copies)
    reason = stage()
    if reason:
        from sphinx.util import logging
        logging.getLogger(__name__).warning(f"chapter 12's calculator is unavailable in this build: {reason}.")
    app.config.html_static_path.append(str(STAGE))


def inputs_digest() -> str:
    """What the calculator's pages serve besides their own source: the script, its style, the modules
    copied from code/ and the manifest (which names the Pyodide version)."""
    h = hashlib.sha256()
    for path in sorted([*(REPO / "_static").glob("calculator.*"), *(STAGE / "calculator").rglob("*")]):
        if path.is_file():
            h.update(path.name.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def outdated_pages(app, env, added, changed, removed):
    """env-get-outdated: Sphinx copies static files only when it writes a page, so an edit to
    calculator.js alone would leave the old copy in _build/html. Mark the pages that hold the
    calculator outdated whenever what they serve changed."""
    digest = inputs_digest()
    if getattr(env, "calculator_digest", None) == digest:
        return []
    env.calculator_digest = digest
    return [doc for doc in env.found_docs
            if MARK in Path(env.doc2path(doc)).read_text(encoding="utf-8", errors="replace")]


def setup(app):
    """What sphinx_ext.py connects."""
    app.connect("builder-inited", add_static_files)
    app.connect("env-get-outdated", outdated_pages)

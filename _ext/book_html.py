"""Small additions to what Jupyter Book 1.0 does with the book.

Cells tagged `cuda` execute only where CUDA exists: on a machine without it, they get the
`skip-execution` tag as the page is read, so the build leaves them without output instead of
failing (nbval skips the same cells; see chapters/conftest.py).

The HTML fixes below make pages load with no console errors.

sphinx-thebe adds its inline configuration script once per `env-before-read-docs`, which fires
more than once in a Jupyter Book build; the second copy redeclares a `const` and throws in the
browser. Keep the first of any identical scripts.
"""
import re


def dedupe_scripts(app, pagename, templatename, context, doctree):
    seen, unique = set(), []
    for script in context.get("script_files", []):
        # an inline script is registered with filename None by one caller and '' by another
        key = (getattr(script, "filename", script) or "", tuple(sorted(getattr(script, "attributes", {}).items())))
        if key not in seen:
            seen.add(key)
            unique.append(script)
    context["script_files"] = unique


TAGS_LINE = re.compile(r"(?m)^:tags: \[([^\]\n]*)\]")


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def skip_cuda_cells_without_cuda(app, docname, source):
    """source-read: add skip-execution to the tags of every cell tagged cuda, if there is no CUDA."""
    text = source[0]
    if "cuda" not in text or not TAGS_LINE.search(text):
        return

    def add_skip(match):
        tags = [t.strip() for t in match.group(1).split(",") if t.strip()]
        if "cuda" in tags and "skip-execution" not in tags:
            tags.append("skip-execution")
        return f":tags: [{', '.join(tags)}]"

    if any("cuda" in m.group(1) for m in TAGS_LINE.finditer(text)) and not _has_cuda():
        source[0] = TAGS_LINE.sub(add_skip, text)


def setup(app):
    app.connect("source-read", skip_cuda_cells_without_cuda)
    app.connect("html-page-context", dedupe_scripts, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}

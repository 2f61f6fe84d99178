"""Small additions to what Jupyter Book 1.0 does with the book; _config.yml loads this extension.

- The cuda-cell rule as the build reads a page: without CUDA, cells tagged `cuda` get `skip-execution`,
  so the build leaves them without output instead of failing (cuda.py; nbval skips the same cells).
- A page loads with no console errors: sphinx-thebe adds its inline configuration script once per
  `env-before-read-docs`, which fires more than once in a Jupyter Book build; the second copy
  redeclares a `const` and throws in the browser. Keep the first of any identical scripts.
- The provenance page's table (provenance.py): how, when and where each chapter was executed.
"""
from . import provenance
from .cuda import skip_cuda_cells


def skip_cuda_cells_without_cuda(app, docname, source):
    """source-read: the page's source after the cuda rule."""
    source[0] = skip_cuda_cells(source[0])


def dedupe_scripts(app, pagename, templatename, context, doctree):
    seen, unique = set(), []
    for script in context.get("script_files", []):
        # an inline script is registered with filename None by one caller and '' by another
        key = (getattr(script, "filename", script) or "", tuple(sorted(getattr(script, "attributes", {}).items())))
        if key not in seen:
            seen.add(key)
            unique.append(script)
    context["script_files"] = unique


def setup(app):
    app.connect("source-read", skip_cuda_cells_without_cuda)
    app.connect("html-page-context", dedupe_scripts, priority=900)
    provenance.setup(app)
    return {"parallel_read_safe": True, "parallel_write_safe": True}

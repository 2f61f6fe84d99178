"""Small additions to what Jupyter Book 1.0 does with the book; _config.yml loads this extension.

- The cuda-cell rule as the build reads a page: without CUDA, cells tagged `cuda` get `skip-execution`,
  so the build leaves them without output instead of failing (cuda.py; nbval skips the same cells), and
  below each such cell the page shows the outputs of the last real GPU run stored in the chapter's
  .ipynb, labelled with the GPU, date and commit, or says that there is none.
- A page loads with no console errors: sphinx-thebe adds its inline configuration script once per
  `env-before-read-docs`, which fires more than once in a Jupyter Book build; the second copy
  redeclares a `const` and throws in the browser. Keep the first of any identical scripts.
- Chapter 7's calculator: the Pyodide runtime and budget.py's modules join the static files (pyodide.py).
- The provenance page's table (provenance.py): how, when and where each chapter was executed.
- The search index knows the glossary's terms: a jieba user dictionary made from it (search_terms.py).
"""
from . import provenance, pyodide
from .cuda import show_stored_gpu_outputs, skip_cuda_cells
from .search_terms import use_glossary_dictionary


def skip_cuda_cells_without_cuda(app, docname, source):
    """source-read: the page's source after the cuda rule."""
    source[0] = show_stored_gpu_outputs(skip_cuda_cells(source[0]), app.env.doc2path(docname))


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
    app.connect("config-inited", use_glossary_dictionary)  # jieba keeps the glossary's compounds whole
    app.connect("html-page-context", dedupe_scripts, priority=900)
    pyodide.setup(app)  # chapter 7's calculator: Pyodide and budget.py in _static
    provenance.setup(app)  # the provenance page's table
    return {"parallel_read_safe": True, "parallel_write_safe": True}

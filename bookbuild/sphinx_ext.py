"""Small additions to what Jupyter Book 1.0 does with the book; _config.yml loads this extension.

- Below each cell tagged `cuda`, which the build does not execute (its static `skip-execution` tag,
  cuda.py), the page shows the outputs of the last real GPU run stored in the chapter's .ipynb,
  labelled with the GPU, date and commit, or says that there is none.
- A page loads with no console errors: sphinx-thebe adds its inline configuration script once per
  `env-before-read-docs`, which fires more than once in a Jupyter Book build; the second copy
  redeclares a `const` and throws in the browser. Keep the first of any identical scripts.
- The pages whose execution-cache key changed are read again, and the kernel of each page executed
  logs the files it loads (reads.py).
- Chapter 12's calculator: the Pyodide runtime and budget.py's modules join the static files (pyodide.py).
- The provenance page's table (provenance.py): how, when and where each chapter was executed; and on
  each chapter's first screen, a sentence saying how long it took to execute and on which CPU.
- The search finds every Chinese word a page contains, opens a hit at its section and ranks the chapter
  that teaches a glossary term first (search.py).
- Quotation marks, figure numbers per chapter and the hidden cells' prompts, in Chinese (pages.py).
- The PDF's LaTeX (pdf.py): fonts and Chinese labels, the web pages' figure numbers, and a sentence
  with a command where the web page has what a PDF cannot hold.
"""
from . import pages, pdf, provenance, pyodide, reads
from .cuda import show_stored_gpu_outputs
from .search import use_book_search


def show_stored_gpu_outputs_as_read(app, docname, source):
    """source-read: the page's source with the stored GPU outputs below its cuda cells."""
    source[0] = show_stored_gpu_outputs(source[0], app.env.doc2path(docname))


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
    app.connect("source-read", show_stored_gpu_outputs_as_read)
    app.connect("config-inited", use_book_search)  # the n-gram index, its query splitter and scorer
    pages.setup(app)  # quotation marks, figure numbers, the hidden cells' prompts
    app.connect("html-page-context", dedupe_scripts, priority=900)
    reads.setup(app)  # re-read the pages whose key changed; trace what an executed page loads
    pyodide.setup(app)  # chapter 12's calculator: Pyodide and budget.py in _static
    provenance.setup(app)  # the provenance page's table, and each chapter's running time at its top
    pdf.setup(app)  # the PDF's LaTeX: preamble, figure numbers, what a PDF cannot hold
    return {"parallel_read_safe": True, "parallel_write_safe": True}

"""The book's machinery: everything that builds, executes or checks the book, each decision once.

    python -m bookbuild.build [--strict]            # build _build/html (what README's command 1 runs)
    python -m bookbuild.refresh [NN_name.md ...]    # re-execute chapters into their paired .ipynb
    python -m bookbuild.gpu_run [--copy-to DIR]     # on a GPU: run the cuda cells, store their outputs
    python -m bookbuild.portability [NN_name.md ...] # nbval under other CPUs' kernels, with each assert's margin
    python -m bookbuild.pdf                         # the book as a PDF, _build/pdf/, from the execution cache
    python -m bookbuild.rehearse [--subset]         # the budget's printed commands, shrunk, run on this CPU
    python -m bookbuild.full_size [--representatives] # the same commands unshrunk, simulated: peak vs ledger

What lives where:

- book.py        the book as _toc.yml and _config.yml describe it: the front page and the chapters
                 (paths of their .md files), a chapter's number (its place in _toc.yml) and a page's
                 title, and what every chapter must carry (the hidden setup cell, a row in the front
                 page's table, a paired .ipynb, a sanitizer section);
                 tests/test_chapter_checklist.py checks each chapter against it.
- cuda.py        the cuda-cell rule: cells tagged `cuda` also carry `skip-execution` and
                 `nbval-skip`, so the build, the refresh and nbval never execute them; the GPU run a
                 chapter's .ipynb may store for them, and how the page shows it.
- cache.py       each page's key (its inputs, as reads.py finds them), the execution cache it keys (an
                 execution is dropped only when its page's key changed), the notebook a chapter's .md
                 becomes in a build, with the outputs nbval produced for it; nbval's record of passes
                 (`python -m bookbuild.cache --map`: the page-to-files map).
- reads.py       what a page's execution can read: statically, the code/ modules it imports (to the end),
                 the scripts it starts and the data files; at run time, trace/sitecustomize.py's log of
                 what its kernel and the kernel's processes loaded, which must lie inside the key.
- nbval_hooks.py the pytest hooks that chapters/conftest.py imports: trace each chapter's kernel and check
                 what it loaded, hand each chapter that passed nbval to the execution cache, and with
                 BOOK_NBVAL_CHANGED_ONLY=1 leave out the chapters unchanged since a run that passed.
- build.py       the book build (`python -m bookbuild.build`).
- refresh.py     the reference-output refresh (`python -m bookbuild.refresh`); it stores a page only
                 when the machine was quiet while it ran (quiet.py).
- quiet.py       how busy the machine was when each stored page was made: its calibration line against
                 its CPU's quiet figure (the fastest stored page of that CPU), the limit FACTOR, and the
                 provenance page's sentence; tests/test_quiet.py fails on a page made above the limit.
- gpu_run.py     the GPU run (`python -m bookbuild.gpu_run`): on a machine with CUDA, execute the
                 cuda cells and store their outputs, labelled, in the chapter's .ipynb.
- portability.py the portability run (`python -m bookbuild.portability`): what each kernel configuration
                 (native, no AMX, AVX2, 1 and 4 threads) changes on this CPU, then nbval over chapters
                 under each, with the margins of their measure.check asserts.
- rehearse.py    the rehearsal (`python -m bookbuild.rehearse`): every train_gpu.py command code/budget.py
                 prints for its named models on common GPUs, and a pairwise covering set of the options
                 (schemes, --grad-sync, checkpointing, compile, fp16, 1/2/4 processes, 2 nodes), parsed
                 by torchrun's and train_gpu.py's own parsers, shrunk and run with gloo; checks the held
                 bytes against the ledger, a SIGTERM's exit 75 and checkpoint, resumes; a table in _build/.
- full_size.py   the budget's printed commands at their full size (code/fake_run.py: rank 0 on a fake
                 process group, fake tensors, torch's memory tracker) against the ledger; which of them
                 stand for the rest in the slow test (representatives); a table in _build/.
- pyodide.py     chapter 12's calculator: the pinned Pyodide (npm package, version and integrity), fetched
                 and cached under _build/, and budget.py with the modules it imports, copied from code/
                 into the HTML's _static/ at every build.
- sphinx_ext.py  the Sphinx extension that _config.yml loads: the stored GPU outputs below the
                 cuda cells as the build reads a page, the HTML fix that drops a duplicated script,
                 the calculator's static files and provenance.py's directive and chapter sentence.
- pdf.py         the PDF (`python -m bookbuild.pdf`): Jupyter Book's LaTeX builder and latexmk with xelatex,
                 from the execution cache; the Debian package a missing TeX file or font is in; in the
                 LaTeX build, the Chinese fonts and labels, the web pages' figure numbers, the front page
                 as one chapter, and a sentence with a command where the web page has what a PDF cannot
                 hold (the search, chapter 12's calculator).
- pages.py       how the pages read in Chinese: ASCII quotes paired as “…” (smart quotes are off), figures
                 numbered per chapter (图 6.1), the hidden cells' show/hide prompts, the search box.
- search.py      the search: an index of each page's Chinese character pairs (every word of two or more
                 characters is found), the query splitter, the glossary's teaching chapter first, hits
                 opening at their section; search_terms.py reads the glossary's terms and chapters.
- provenance.py  the provenance page's table (chapters/provenance.md): how, when, where and how long
                 each chapter was executed, from myst-nb's execution data and the execution cache; and
                 from the same data, the sentence after each chapter's first paragraph that says how long
                 the chapter took to execute and on which CPU, linking to that page.

Not here: code/measure.py's glue_measured, the one way a chapter glues a machine-dependent value. Its
stored record, ('3.2 ms'), is the one form tests/nbval_sanitize.cfg masks; myst-nb's {glue:text} shows it
as 3.2 ms, and a string glued with plain glue() ('9.44') is compared digit for digit.

Run the commands from the repository root; pytest finds the package through pyproject.toml's pythonpath.
"""

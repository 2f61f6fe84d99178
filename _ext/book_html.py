"""Small fixes to the HTML that Jupyter Book 1.0 writes, so pages load with no console errors.

sphinx-thebe adds its inline configuration script once per `env-before-read-docs`, which fires
more than once in a Jupyter Book build; the second copy redeclares a `const` and throws in the
browser. Keep the first of any identical scripts.
"""


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
    app.connect("html-page-context", dedupe_scripts, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}

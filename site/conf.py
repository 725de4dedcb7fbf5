"""Sphinx configuration of the course website: build it with ``python docs/build_site.py``.

That script stages ``site/index.md``, ``notebooks/`` and ``docs/instructors.md`` in a temporary folder and runs
Sphinx on it with this configuration.  Notebooks are rendered from their stored outputs (never executed): the
stepper each ``%%lens`` cell stores as a self-contained ``text/html`` output, with its own script, is copied into
the page as it is, so it steps with no kernel and no network.  Nothing on the pages comes from a CDN.
"""

project = "autograd_lens course"
author = "autograd_lens"
root_doc = "index"
extensions = ["myst_nb"]
exclude_patterns = ["**/.ipynb_checkpoints"]
suppress_warnings = ["myst.header"]  # a notebook may go from # to ### (harmless on a page)

# stored outputs only: the notebooks are executed and checked by nbval, not here
nb_execution_mode = "off"
# no require.js / widget manager (they would come from a CDN); a widget view without saved state would render
# empty, so its display bundle's text/html (the kernel-free stepper) is shown instead
nb_ipywidgets_js = {}
nb_mime_priority_overrides = [("*", "application/vnd.jupyter.widget-view+json", None)]

html_theme = "furo"  # its CSS, JS and fonts ship in the package (no CDN)
html_title = "autograd_lens course"
html_show_sourcelink = False
html_copy_source = False
html_last_updated_fmt = None


def link_folders_to_their_index(app, doctree):
    """A link to a folder (``[solutions](solutions/)``, which works on GitHub) opens the folder's index page."""
    from posixpath import dirname, join, normpath

    from sphinx import addnodes

    for node in doctree.findall(addnodes.pending_xref):
        target = node.get("reftarget", "")
        if node.get("reftype") == "myst" and node.get("refdomain") is None and target.endswith("/"):
            docname = normpath(join(dirname(app.env.docname), target, "index"))
            if docname in app.env.found_docs:
                node["refdomain"], node["reftarget"], node["reftargetid"] = "doc", docname, None


def setup(app):
    app.connect("doctree-read", link_folders_to_their_index)

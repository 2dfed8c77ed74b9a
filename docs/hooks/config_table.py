"""MkDocs hook: the table of ``RAY_LITE_*`` variables, made from
``ray_lite/_config.py`` at build time so the page cannot drift from the code.

A page that holds the marker ``<!-- ray_lite:config-table -->`` gets the table
in its place; the build fails if configuration.md lost the marker.
"""
import importlib.util
import os

MARKER = "<!-- ray_lite:config-table -->"
_PAGE = "configuration.md"


def _load_config_module(config_file_path):
    # Loaded by path: the table needs the variables only, not the runtime.
    root = os.path.dirname(os.path.abspath(config_file_path))
    path = os.path.join(root, "ray_lite", "_config.py")
    spec = importlib.util.spec_from_file_location("_ray_lite_config_for_docs", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _cell(text):
    return str(text).replace("|", "\\|").replace("\n", " ")


def config_table(variables):
    rows = ["| Variable | Default | Accepts | What it does |", "|---|---|---|---|"]
    for v in variables:
        default = f"`{v.default}`" if v.default != "" else "(empty)"
        rows.append(f"| `{v.name}` | {default} | {_cell(v.accepts)} | {_cell(v.meaning)} |")
    return "\n".join(rows)


def on_page_markdown(markdown, page, config, files):
    if MARKER not in markdown:
        if page.file.src_uri == _PAGE:
            raise ValueError(f"docs/{_PAGE} lost the marker {MARKER}")
        return markdown
    module = _load_config_module(config.config_file_path)
    return markdown.replace(MARKER, config_table(module.VARIABLES))

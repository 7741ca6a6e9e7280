"""MkDocs hook: the site's home page (docs/index.md) is the project's README.md.

MkDocs reads only files under docs/, and the README's links point into docs/ from the repository root
(``docs/rules.md``); this hook substitutes the README's text for index.md's and rewrites those links
relative to the docs directory, so GitHub and the site show one text with working links.
"""
from __future__ import annotations

import pathlib
import re

_README = pathlib.Path(__file__).resolve().parents[2] / "README.md"
# [text](docs/page.md) or (docs/page.md#anchor): the README's links into the docs directory
_DOCS_LINK = re.compile(r"\]\(docs/")


def on_page_markdown(markdown, page, config, files):
    """Replace index.md's placeholder with the README, links made relative to docs/."""
    if page.file.src_uri != "index.md":
        return markdown
    return _DOCS_LINK.sub("](", _README.read_text(encoding="utf-8"))


def on_serve(server, config, builder):
    """``mkdocs serve``: rebuild when README.md changes too."""
    server.watch(str(_README))
    return server

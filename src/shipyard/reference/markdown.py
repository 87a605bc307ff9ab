"""Markdown for the reference pages: tables whose cells hold the code's own prose.

The code's docstrings quote names in reStructuredText's double backticks; the pages
quote them in Markdown's single ones. Outside code spans, the characters Markdown would
read as markup (``<`` as HTML, ``*`` as emphasis, ``|`` as a cell's end) are escaped.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

_CODE = re.compile(r"``(.+?)``|`([^`]+)`", re.DOTALL)
_MARKUP = re.compile(r"([\\*_\[\]<|])")


def prose(text: str) -> str:
    """``text`` (a docstring's paragraph) as Markdown on one line."""
    out, at = [], 0
    flat = " ".join(text.split())
    for found in _CODE.finditer(flat):
        out.append(_escape(flat[at : found.start()]))
        out.append(code(found.group(1) or found.group(2)))
        at = found.end()
    out.append(_escape(flat[at:]))
    return "".join(out)


def _escape(text: str) -> str:
    return _MARKUP.sub(r"\\\1", text)


def code(text: str) -> str:
    """``text`` as a code span. A ``|`` is left outside, escaped, between two spans: in a
    table a pipe would end the cell, and escapes inside code spans are read differently
    by Python-Markdown (MkDocs) and by GitHub."""
    if "|" in text:
        return " \\| ".join(code(part.strip()) for part in text.split("|"))
    fence = "``" if "`" in text else "`"
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def table(head: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """A pipe table; cells are already Markdown."""
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    lines += ["| " + " | ".join(cell or " " for cell in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def page(title: str, intro: str, *sections: str) -> str:
    """A whole page: its title, the note that it is generated, and its sections."""
    parts = [f"# {title}\n", GENERATED, intro.strip() + "\n", *sections]
    return "\n".join(part.rstrip("\n") + "\n" for part in parts if part)


GENERATED = "*Generated from the code by `make docs-reference`: edit the code, not this page.*\n"


def first_paragraph(doc: str | None) -> str:
    """The first paragraph of a docstring, as Markdown."""
    if not doc:
        return ""
    return prose(doc.strip().split("\n\n")[0])

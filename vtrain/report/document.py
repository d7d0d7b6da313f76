"""A report as one list of sections, rendered to Markdown (``report.md``) and to one self-contained HTML page
(``report.html``, plotly.js inlined once).

Every report builds a :class:`Document` once; :func:`render_markdown` and :func:`render_html` walk the same
sections, so a section added or renamed shows in both files. Figures appear only in HTML.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Union

if TYPE_CHECKING:
    import plotly.graph_objects as go

#: a table: its header and its rows, every cell already formatted
Table = tuple[list[str], list[list[str]]]

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; }
th:first-child, td:first-child { text-align: left; }
h1 { font-size: 1.5em; } h2 { margin-top: 2em; border-bottom: 1px solid #ddd; }
.note { color: #555; }
"""


@dataclass
class Text:
    """A paragraph; ``note`` paragraphs are shown quieter in HTML."""

    text: str
    note: bool = False


@dataclass
class Bullets:
    """A list of lines."""

    lines: list[str]


@dataclass
class TableBlock:
    """A table, with an optional caption line above it."""

    table: Table
    caption: str = ""


@dataclass
class Figure:
    """A plotly figure (HTML only)."""

    figure: go.Figure


Block = Union[Text, Bullets, TableBlock, Figure]


@dataclass
class Section:
    """A titled section; ``level`` 2 is a section, 3 a sub-section."""

    title: str
    blocks: list[Block] = field(default_factory=list)
    level: int = 2


@dataclass
class Document:
    """A whole report: its title, the lines under the title, the figures at the top (HTML) and its sections."""

    title: str
    heading: list[Block] = field(default_factory=list)
    sections: list[Section] = field(default_factory=list)


def markdown_table(table: Table) -> str:
    """A Markdown table (``_none_`` when it has no rows)."""
    header, rows = table
    if not rows:
        return "_none_\n"
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(_markdown_cell(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def _markdown_cell(text: str) -> str:
    """A cell on one line: a ``|`` escaped, a line break (a name from a user's file may hold one) as a space."""
    return " ".join(text.split("\n")).replace("\r", " ").replace("|", "\\|")


def html_table(table: Table) -> str:
    """An HTML table (a quiet "none" when it has no rows)."""
    header, rows = table
    if not rows:
        return "<p class='note'>none</p>"
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def render_markdown(document: Document) -> str:
    """``report.md``: the title, the heading blocks, then every section (figures left out)."""
    out = [f"# {document.title}\n", *_markdown_blocks(document.heading)]
    for section in document.sections:
        out.append(f"{'#' * section.level} {section.title}\n")
        out += _markdown_blocks(section.blocks)
    return "\n".join(out).rstrip("\n") + "\n"


def render_html(document: Document, *, page_title: str | None = None) -> str:
    """``report.html``: one page with the same sections; plotly.js is inlined with the first figure."""
    state = {"plotly_inlined": False}
    parts = [f"<h1>{html.escape(document.title)}</h1>", *_html_blocks(document.heading, state)]
    for section in document.sections:
        parts.append(f"<h{section.level}>{html.escape(section.title)}</h{section.level}>")
        parts += _html_blocks(section.blocks, state)
    title = html.escape(page_title or document.title)
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{title}</title><style>{STYLE}</style></head>"
            "<body>" + "\n".join(parts) + "</body></html>\n")


def _markdown_blocks(blocks: Sequence[Block]) -> list[str]:
    out: list[str] = []
    for block in blocks:
        if isinstance(block, Text):
            out.append(f"{block.text}\n")
        elif isinstance(block, Bullets):
            out += [f"- {line}" for line in block.lines] + [""]
        elif isinstance(block, TableBlock):
            if block.caption:
                out.append(f"{block.caption}\n")
            out.append(markdown_table(block.table))
    return out


def _html_blocks(blocks: Sequence[Block], state: dict[str, bool]) -> list[str]:
    out: list[str] = []
    for block in blocks:
        if isinstance(block, Text):
            out.append(f"<p{' class=note' if block.note else ''}>{html.escape(block.text)}</p>")
        elif isinstance(block, Bullets):
            out.append("<ul>" + "".join(f"<li>{html.escape(line)}</li>" for line in block.lines) + "</ul>")
        elif isinstance(block, TableBlock):
            if block.caption:
                out.append(f"<p class='note'>{html.escape(block.caption)}</p>")
            out.append(html_table(block.table))
        elif isinstance(block, Figure):
            inline = "inline" if not state["plotly_inlined"] else False
            state["plotly_inlined"] = True
            out.append(block.figure.to_html(full_html=False, include_plotlyjs=inline))
    return out

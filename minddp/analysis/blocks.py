"""A report block, built once and rendered twice: for the console (at most 120 columns) and for the HTML page.

What a section of the report says is built as data, a :class:`Block` (the verdict's, :mod:`.verdict`; the
comparison's, :mod:`.compare`), and each renderer only lays it out:

1. **text** carries two marks, ``**bold**`` and ``` ``code`` ``` (a stage, a setting's key), which the console drops
   and the page renders; everything else is text: the page escapes every character of it, so a run or stage
   named after a folder (``<``, ``&``, quotes) shows as written and never as markup;
2. a :class:`Block` holds a heading, a list, paragraphs, a :class:`Table` and notes, in that order;
3. a table's :class:`Column` gives its header, its width and alignment in the console, and whether the console
   shows its cells' spread; a ``wide`` column (sentences) goes under the table in the console, one line per row
   named by its first text column;
4. a :class:`Cell` is a text and, where the number has one, its spread (least–most over the profiled steps),
   which the page shows in brackets after it;
5. :func:`console_lines` and :func:`html_lines` render a block.

Example::

    >>> table = Table([Column("stage", 8, left=True), Column("ms", 14, console_spread=True)],
    ...               [Row([Cell("<b&d>"), Cell("1.5", "1.0–2.0")])])
    >>> block = Block("x", "Heading", ["One **bold** word."], table=table)
    >>> print("\\n".join(console_lines(block)))
    Heading
    One bold word.
    stage                ms
    <b&d>     1.5 (1.0–2.0)
    >>> [line for line in html_lines(block) if "<td" in line]
    ["<tr><td class='text'>&lt;b&amp;d&gt;</td><td>1.5 (1.0–2.0)</td></tr>"]
"""

from __future__ import annotations

import html
import re
import textwrap
from dataclasses import dataclass, field

#: The widest console line.
WIDTH = 120
_MARK = re.compile(r"\*\*(.+?)\*\*|``(.+?)``")


def plain(text: str) -> str:
    """Step 1 for the console: the text without its marks."""
    return _MARK.sub(lambda m: m.group(1) or m.group(2), text)


def marked(text: str, links: dict[str, str] | None = None) -> str:
    """Step 1 for the page: the text escaped, its marks as ``<b>``/``<code>``, and each key of ``links`` (a path
    named in the text, such as ``docs/analysis.md``) as the link its value holds (HTML)."""
    out, last = [], 0
    for m in _MARK.finditer(text):
        out.append(html.escape(text[last : m.start()]))
        out.append(f"<b>{html.escape(m.group(1))}</b>" if m.group(1) else f"<code>{html.escape(m.group(2))}</code>")
        last = m.end()
    out.append(html.escape(text[last:]))
    page = "".join(out)
    for name, link in (links or {}).items():
        page = page.replace(html.escape(name), link)
    return page


@dataclass
class Cell:
    """Step 4: a table's cell."""

    text: str
    spread: str = ""  # "least–most", shown in brackets after the text (on the page; in the console if its column says)


@dataclass
class Column:
    """Step 3: a table's column."""

    header: str
    width: int = 0  # in the console; 0: as wide as its header
    left: bool = False  # text (left-aligned), else a number (right-aligned)
    console_spread: bool = False  # the console shows the cells' spread too
    wide: bool = False  # sentences: in the console, under the table as ``<first cell>: <text>``
    css: str = ""  # the page's class for its cells (``text`` for left-aligned ones by default)


@dataclass
class Row:
    cells: list[Cell]
    css: str = ""  # the page's class for the row (e.g. ``noise``: greyed)
    data: dict[str, str] = field(default_factory=dict)  # the page's ``data-*`` attributes
    wide: bool = False  # a row that spans the table: its first cell only (e.g. a stage in one run only)


@dataclass
class Table:
    columns: list[Column]
    rows: list[Row]
    id: str = ""
    css: str = ""


@dataclass
class Block:
    """Step 2: one section of the report."""

    id: str
    heading: str
    paragraphs: list[str] = field(default_factory=list)
    items: list[str] = field(
        default_factory=list
    )  # under the heading (the page: a bulleted list; the console: indented)
    table: Table | None = None
    notes: list[str] = field(default_factory=list)  # small print under the table
    css: str = ""


def _cell(cell: Cell, spread: bool) -> str:
    return f"{cell.text} ({cell.spread})" if spread and cell.spread else cell.text


def _console_table(table: Table) -> list[str]:
    shown = [(i, c) for i, c in enumerate(table.columns) if not c.wide]
    widths = [max(c.width, len(c.header)) for _, c in shown]

    def line(texts: list[str]) -> str:
        parts = [t.ljust(w) if c.left else t.rjust(w) for t, w, (_, c) in zip(texts, widths, shown)]
        return " ".join(parts).rstrip()

    lines = [line([c.header for _, c in shown])]
    for row in table.rows:
        if row.wide:
            lines.append(" ".join(plain(c.text) for c in row.cells))
            continue
        lines.append(line([plain(_cell(row.cells[i], c.console_spread)) for i, c in shown]))
    name = next((i for i, c in enumerate(table.columns) if c.left and not c.wide), 0)  # what names a row
    for i, column in enumerate(table.columns):
        if column.wide:
            for row in table.rows:
                if not row.wide:
                    lines += textwrap.wrap(
                        f"{plain(row.cells[name].text)}: {plain(row.cells[i].text)}", WIDTH, subsequent_indent="    "
                    )
    return lines


def console_lines(block: Block) -> list[str]:
    """Step 5: the block as lines of at most :data:`WIDTH` characters (a table's lines are its columns' widths)."""
    lines = textwrap.wrap(plain(block.heading), WIDTH)
    lines += [f"  {plain(item)}" for item in block.items]
    for paragraph in block.paragraphs:
        lines += textwrap.wrap(plain(paragraph), WIDTH)
    if block.table is not None:
        lines += _console_table(block.table)
    for note in block.notes:
        lines += textwrap.wrap(plain(note), WIDTH)
    return lines


def _attributes(**attributes: str) -> str:
    return "".join(f" {name}='{html.escape(value)}'" for name, value in attributes.items() if value)


def html_lines(block: Block, links: dict[str, str] | None = None, level: int = 2) -> list[str]:
    """Step 5: the block as HTML, one element a line; ``links``: as in :func:`marked`."""
    parts = [f"<section{_attributes(**{'class': block.css, 'id': block.id})}>"]
    parts.append(f"<h{level}>{marked(block.heading, links)}</h{level}>")
    if block.items:
        parts += ["<ul>", *(f"<li>{marked(item, links)}</li>" for item in block.items), "</ul>"]
    parts += [f"<p>{marked(p, links)}</p>" for p in block.paragraphs]
    table = block.table
    if table is not None:
        parts.append(f"<div class='scroll'><table{_attributes(**{'class': table.css, 'id': table.id})}>")
        heads = "".join(
            f"<th{_attributes(**{'class': 'text' if c.left else ''})}>{marked(c.header, links)}</th>"
            for c in table.columns
        )
        parts.append(f"<tr>{heads}</tr>")
        for row in table.rows:
            data = {f"data-{k}": v for k, v in row.data.items()}
            attributes = _attributes(**{"class": row.css}, **data)
            if row.wide:
                text = " ".join(marked(c.text, links) for c in row.cells)
                parts.append(f"<tr{attributes}><td class='text' colspan='{len(table.columns)}'>{text}</td></tr>")
                continue
            cells = "".join(
                f"<td{_attributes(**{'class': c.css or ('text' if c.left else '')})}>"
                f"{marked(_cell(cell, True), links)}</td>"
                for c, cell in zip(table.columns, row.cells)
            )
            parts.append(f"<tr{attributes}>{cells}</tr>")
        parts.append("</table></div>")
    parts += [f"<p class='cpu'>{marked(note, links)}</p>" for note in block.notes]
    parts.append("</section>")
    return parts


__all__ = ["Block", "Table", "Column", "Row", "Cell", "console_lines", "html_lines", "plain", "marked", "WIDTH"]

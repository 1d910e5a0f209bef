"""Markdown tables (GitHub style), without pulling in ``tabulate`` for ``DataFrame.to_markdown``."""

from __future__ import annotations

from collections.abc import Sequence


def table(headers: Sequence[str], rows: Sequence[Sequence[object]],
          align: Sequence[str] | None = None) -> str:
    """A pipe table; ``align`` per column is ``"l"`` or ``"r"`` (default: the first column
    left, the rest right, as numbers are)."""
    align = align or ["l", *("r" * (len(headers) - 1))]
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]

    def line(row: list[str]) -> str:
        return "| " + " | ".join(c.ljust(w) if a == "l" else c.rjust(w)
                                 for c, w, a in zip(row, widths, align, strict=False)) + " |"

    rule = "|" + "|".join(("-" * (w + 1) + ":") if a == "r" else (":" + "-" * (w + 1))
                          for w, a in zip(widths, align, strict=False)) + "|"
    return "\n".join([line(cells[0]), rule, *(line(r) for r in cells[1:])])

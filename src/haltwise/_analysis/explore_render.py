"""How ``haltwise explore`` shows its report to a person: one table row per cancel point.

``rich`` is imported inside :func:`render_rich`, so that :mod:`haltwise.testing` (which a user's
test suite imports) does not pull it in. User data (tool names, violation texts) is printed
literally, never read as rich markup.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console
    from rich.text import Text

    from ..testing import ExploreReport, PointReport

__all__ = ["render_rich"]

_STATE_STYLE = {"completed": "green", "cancelled": "yellow", "failed": "bold red"}


def render_rich(report: ExploreReport, console: Console) -> None:
    """Print the report: a headline, a table of every cancel point, then every violation.

    The table has one row per point and force (``at``, ``force``, the state and retry advice
    right after the cancel, and ``ok`` or the number of violations). The violations follow in
    full, one per line, so that none is cut to the table's width.
    """
    from rich.table import Table
    from rich.text import Text

    console.print(Text(report.headline(), style="bold"))
    table = Table(show_edge=False, header_style="bold")
    for column in ("at", "force", "state", "retry", "check"):
        table.add_column(column)
    for verb, point in [("", p) for p in report.points] + [
        ("pause ", p) for p in report.pauses or ()
    ]:
        table.add_row(
            Text(verb + point.at),
            Text("-" if verb else "yes" if point.force else "no"),
            Text(point.state.value, style=_STATE_STYLE.get(point.state.value, "")),
            Text(point.retry.value),
            _check(point),
        )
    console.print(table)
    if report.ok:
        console.print(Text("All invariants hold.", style="bold green"))
        return
    console.print(Text(f"{len(report.violations)} violation(s):", style="bold red"))
    for violation in report.violations:
        console.print(Text(f"  - {violation}"))


def _check(point: PointReport) -> Text:
    from rich.text import Text

    if point.ok:
        return Text("ok", style="green")
    return Text(f"{len(point.violations)} violation(s)", style="bold red")

"""Plain lines for people, without rich: what the commands that only read or request print.

A text from the journal (an id, a reason, an error) may hold control characters; written raw
they would drive the terminal (colours, the window title, the cursor), so they are shown
escaped (``\\x1b``), here and in :mod:`.render`, which builds its tables on the same rule.
"""

from __future__ import annotations

import re

import click

__all__ = ["escape_controls", "note"]

#: Control characters a text from the journal may hold: C0 (but the newline), DEL, C1 and the
#: Unicode bidirectional overrides.
_CONTROLS = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def escape_controls(text: str) -> str:
    """``text`` with every control character (see ``_CONTROLS``) written as an escape."""
    return _CONTROLS.sub(_escaped, text)


def _escaped(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def note(text: str) -> None:
    """One plain line on stdout, control characters escaped (not wrapped: a path stays whole)."""
    click.echo(escape_controls(text))

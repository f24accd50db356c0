"""Telling the world: the journal's changes delivered as CloudEvents (``haltwise events``).

A face, like the command line and the server: it reads the journal only through the runtime's
:class:`~haltwise._runtime.seat.Seat`. :mod:`.cloud` makes one change into one CloudEvent whose
``data`` is the run's ``status --json`` object as of that change; :mod:`.sender` delivers them,
at least once and in order per run, keeping its position in the journal (CONTRACT.md,
"Telling the world: traces and events").
"""

from __future__ import annotations

from .sender import Destination, Sender, destination_from

__all__ = ["Destination", "Sender", "destination_from"]

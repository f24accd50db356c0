"""The shielded cancel scope of the step path, made without asking which library runs.

``anyio.CancelScope(shield=True)`` looks up the running async library (sniffio, then the
backend's class) each time it is made: about 1.4 us, more than the scope's own work, and a
step's start waits inside one every time. haltwise runs on anyio's asyncio backend only
(docs/design.md, "Known limits"), so the hot paths make that backend's scope directly:
:func:`shielded` returns exactly the object ``anyio.CancelScope(shield=True)`` would have made
there, with the same behaviour (no cancel scope outside it cancels what it encloses; a native
``Task.cancel()`` still lands, as it does in anyio's).
"""

from __future__ import annotations

import anyio
from anyio._backends._asyncio import CancelScope as _AsyncioCancelScope


def shielded() -> anyio.CancelScope:
    """A new shielded cancel scope of the asyncio backend (``anyio.CancelScope(shield=True)``)."""
    return _AsyncioCancelScope(shield=True)

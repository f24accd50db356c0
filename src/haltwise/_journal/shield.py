"""The shielded cancel scope of the step path, made without asking which library runs.

``anyio.CancelScope(shield=True)`` looks up the running async library (sniffio, then the
backend's class) each time it is made: about 1.4 us, more than the scope's own work, and a
step's start waits inside one every time. haltwise runs on anyio's asyncio backend only
(docs/design.md, "Known limits"), so the hot paths make that backend's scope directly:
:func:`shielded` returns exactly the object ``anyio.CancelScope(shield=True)`` would have made
there, with the same behaviour (no cancel scope outside it cancels what it encloses; a native
``Task.cancel()`` still lands, as it does in anyio's). The backend's class lives in a private
module of anyio: should a later anyio move or rename it, :func:`shielded` makes
``anyio.CancelScope(shield=True)`` itself (slower, the same behaviour).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import anyio


def _maker() -> Callable[[], anyio.CancelScope]:
    """What makes a shielded scope: the asyncio backend's class if anyio still has it where
    this version of haltwise expects it (and it is an ``anyio.CancelScope``), else anyio's own
    dispatching constructor."""
    try:
        from anyio._backends._asyncio import CancelScope as Scope
    except (ImportError, AttributeError):
        return partial(anyio.CancelScope, shield=True)
    if not (isinstance(Scope, type) and issubclass(Scope, anyio.CancelScope)):
        return partial(anyio.CancelScope, shield=True)
    return partial(Scope, shield=True)


#: A new shielded cancel scope of the asyncio backend: what ``anyio.CancelScope(shield=True)``
#: makes there (see the module docstring).
shielded: Callable[[], anyio.CancelScope] = _maker()

"""The operator's requests written at once, from synchronous code: ``haltwise cancel ID``'s path.

A :class:`~haltwise._runtime.seat.Seat` opens a store (an event loop, a writer thread or a
connection pool); a request that names its runs needs none of that.
:func:`request_cancels_now` writes the same request in one transaction on one plain
connection (:func:`haltwise._journal.request_cancels_now`), so that the command that an
operator types under pressure imports neither asyncio, nor anyio, nor the store's machinery.
What it cannot serve it says by returning ``None`` (having written nothing), and the caller
asks a seat. The checks of a request's input and the rule "a cancelling run nobody works"
live here, once, for the seat and the runtime too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .._core.exceptions import InputError
from .._core.states import State
from .._core.views import CancelBatch
from .._journal import request_cancels_now as _request_cancels_now
from .._journal import store_url_from
from .._journal.owner import Leased, held_by_live_owner
from .._journal.secrets import safe_url, scrub
from .._journal.store import CancelResult

__all__ = [
    "CancelResult",
    "cancel_batch",
    "check_no_nul",
    "check_reason",
    "nobody_works",
    "request_cancels_now",
    "safe_url",
    "scrub",
    "store_url_from",
]


def request_cancels_now(
    url: str | None, ids: Sequence[str], *, reason: str, force: bool
) -> CancelResult | None:
    """Record the cancel of the runs ``ids`` in one transaction, as
    :meth:`Seat.request_cancels <haltwise._runtime.seat.Seat.request_cancels>` does for ids, from
    synchronous code; what the request did (the runs it reached, as they are afterwards; the
    named runs already final; the ids the store does not hold). Bad input raises
    :class:`InputError` before anything is written. ``None``, with nothing written, when the
    store cannot be served this way as it is (see :func:`haltwise._journal.request_cancels_now`):
    ask a seat then. Delivering the cancel, and settling a run nobody works, are the caller's."""
    check_reason(reason)
    for run_id in ids:
        check_no_nul(run_id, "a run id or task name")
    return _request_cancels_now(url, list(dict.fromkeys(ids)), reason=reason, force=force)


def nobody_works(run: Leased, own_token: str | None = None) -> bool:
    """A ``cancelling`` run that nobody works (released, or its owner is gone): its cancel
    completes only when someone settles it (CONTRACT.md, ``cancel``). ``own_token`` is the
    asking runtime's owner token: a run it holds is worked, whatever its lease says."""
    if run.state is not State.CANCELLING:
        return False
    if run.owner is not None and run.owner.token == own_token:
        return False
    return not held_by_live_owner(run)


def cancel_batch(
    result: CancelResult,
    *,
    after: Mapping[str, State],
    settled_here: Sequence[str],
    dry_run: bool,
) -> CancelBatch:
    """The :class:`CancelBatch` of a bulk request: ``after`` the runs' states once the cancel
    was delivered (or their orphans settled), ``settled_here`` the runs nobody worked that the
    canceller settled."""
    states = {record.id: record.state for record in (*result.already_final, *result.reached)}
    states.update(after)
    return CancelBatch(
        cancelled=tuple(record.id for record in result.reached),
        already_final=tuple(record.id for record in result.already_final),
        unknown=result.unknown,
        dry_run=dry_run,
        states=states,
        settled_here=tuple(settled_here),
    )


def check_reason(reason: object) -> None:
    """A cancel reason is a non-empty string a store can hold (no NUL character)."""
    if not isinstance(reason, str) or not reason:
        raise InputError("a cancel reason must be a non-empty string")
    check_no_nul(reason, "a cancel reason")


def check_no_nul(text: str, what: str) -> None:
    """Refuse a text a store cannot keep (:class:`InputError`), bad input for both stores
    alike: a NUL character (PostgreSQL text cannot hold one), or a lone surrogate, what a byte
    that is not UTF-8 in a command-line argument becomes (neither store can encode it)."""
    if not isinstance(text, str):
        return
    if "\x00" in text:
        raise InputError(f"{what} cannot contain a NUL character")
    try:
        text.encode()
    except UnicodeEncodeError:
        raise InputError(f"{what} is not valid UTF-8 text") from None

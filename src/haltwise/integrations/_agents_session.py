"""An OpenAI Agents ``Session`` as a resumed run saw it when it first began (``haltwise resume``).

A run that began on a session wrote to it (the user's input, each turn); resumed, its task calls
``Runner.run(agent, input, session=session)`` again, and the SDK would read the grown session into
the first model request (which then differs from the journaled one: ``NonDeterminismError``) and
write every replayed turn a second time. :func:`session_for_attempt` journals, as a step of its
own, how many items the session held when the run began; on a replay whose session has grown it
hands the SDK a :class:`ResumedSession`: the session as it was then, whose writes skip what the
earlier attempt already wrote.
"""

from __future__ import annotations

import json
from typing import Any

from .._runtime.tool import adapter_step

__all__ = ["ResumedSession", "session_for_attempt"]

#: The step that records a session's length when a ``Runner.run`` on it begins.
SESSION_STEP = "session"


async def session_for_attempt(session: Any) -> Any:
    """The session to hand the SDK for this ``Runner.run`` of the current run: ``session`` itself
    when the run begins on it now (the step that journals its length runs) or when it has not
    grown since, else a :class:`ResumedSession` over it (a replay)."""
    measured: list[int] = []

    async def length() -> int:
        measured.append(len(await session.get_items()))
        return measured[-1]

    # the adapter's bookkeeping, not a tool call of the run's budget
    began: int = await adapter_step(length, name=SESSION_STEP)
    if measured:
        return session  # the step ran: this attempt begins the run on the session
    items = await session.get_items()
    if len(items) <= began:
        return session
    return ResumedSession(session, items, began)


def _same(item: Any, saved: Any) -> bool:
    """Whether an item the SDK writes is the one a session holds (compared as JSON)."""
    return _canonical(item) == _canonical(saved)


def _canonical(item: Any) -> str:
    return json.dumps(item, sort_keys=True, default=str)


class ResumedSession:
    """A session as a run saw it when it began, for the run's resumed attempt.

    - ``get_items`` returns the first ``began`` items of the session (those the run began with)
      followed by what this attempt wrote, so the SDK asks the model what it asked the first
      time and the journaled answers replay.
    - ``add_items`` goes through the items the earlier attempt wrote after them in order: an item
      equal to the next of those (a replayed input or turn) is not written again; from the first
      one that differs (a call that runs again and has another result, a new model answer after
      the last journaled one), the rest of the earlier attempt's items are removed from the
      session (``pop_item``) and this attempt's are written in their place. So the session ends
      holding the run once, as its last attempt made it. (Items another run added to the session
      after the earlier attempt, before the resume, are removed with them: resume a run before
      continuing its session with another.)
    - ``pop_item`` removes this attempt's last item from the view (and from the session when it
      was written there); ``clear_session`` clears the session.
    """

    def __init__(self, session: Any, items: list[Any], began: int) -> None:
        self.session = session
        self.session_id = session.session_id
        self.session_settings = getattr(session, "session_settings", None)
        self._earlier = items[began:]  # the earlier attempts' items, still to match
        self._view = list(items[:began])
        self._matched = 0  # how many of _earlier this attempt wrote again
        self._diverged = False

    async def get_items(self, limit: int | None = None) -> list[Any]:
        items = list(self._view)
        return items if limit is None else items[-limit:] if limit > 0 else []

    async def add_items(self, items: list[Any]) -> None:
        fresh: list[Any] = []
        for item in items:
            if fresh or self._diverged:
                fresh.append(item)
            elif self._matched < len(self._earlier) and _same(item, self._earlier[self._matched]):
                self._matched += 1
            else:
                await self._drop_earlier_tail()
                fresh.append(item)
        if fresh:
            await self.session.add_items(fresh)
        self._view.extend(items)

    async def _drop_earlier_tail(self) -> None:
        """Remove from the session the earlier attempt's items this attempt did not repeat."""
        self._diverged = True
        for _ in range(len(self._earlier) - self._matched):
            await self.session.pop_item()
        del self._earlier[self._matched :]

    async def pop_item(self) -> Any:
        if not self._view:
            return None
        item = self._view.pop()
        if self._diverged:
            await self.session.pop_item()
        elif self._matched:
            self._matched -= 1  # still in the session: matched again when written again
        return item

    async def clear_session(self) -> None:
        await self.session.clear_session()
        self._view.clear()
        self._earlier.clear()
        self._matched = 0

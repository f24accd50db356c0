"""The plan keys: runs with the same key get the same write.

A group of final transitions plans each :func:`sql.transition_plan_key` once and writes every
run of that key as planned (``SQLiteStore``'s transition group); that is only sound if the key
holds everything :func:`sql.plan_transition` reads but the run's id. These properties draw runs and
asks from small domains (so that equal keys are common), runs differing also in what the key
leaves out (the id, the owner's host, pid and start), and check that equal keys mean equal
plans. A
rule that starts reading something the key does not hold fails here.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from haltwise import State
from haltwise._core.records import Owner
from haltwise._core.states import is_allowed
from haltwise._journal import sql
from haltwise._journal.rows import HeadRow

_STATES = st.sampled_from(list(State))
_TOKENS = st.sampled_from([None, "t1", "t2"])


@st.composite
def _heads(draw: st.DrawFn) -> HeadRow:
    token = draw(_TOKENS)
    owner = None
    if token is not None:
        host, pid = draw(st.sampled_from(["h1", "h2"])), draw(st.integers(1, 3))
        owner = Owner(token=token, host=host, pid=pid, started=draw(st.sampled_from([1.0, 2.0])))
    return HeadRow(
        id=draw(st.sampled_from(["r1", "r2"])),
        state=draw(_STATES),
        reason=draw(st.sampled_from([None, "user", "parent"])),
        pause=draw(st.booleans()),
        owner=owner,
    )


def _plan(head: HeadRow, ask: tuple[Any, ...]) -> object:
    """The write planned for ``head``, or the type of what planning raised (its message names
    the run, which the key leaves out on purpose)."""
    target, expected, fields, fence = ask
    try:
        return sql.plan_transition(head, target, expected, fields, fence=fence, now=1.0)
    except Exception as error:
        return type(error)


_FIELDS = [{}, {"owner": None}, {"reason": "done", "owner": None}, {"result": "1"}]


@st.composite
def _asks(draw: st.DrawFn, head: HeadRow) -> tuple[Any, ...]:
    """A transition asked of ``head``, mostly one its rules allow (a refused ask reads less of
    the run: an ask that passes every check is where a key missing a field shows)."""
    allowed = [state for state in State if is_allowed(head.state, state)]
    target = draw(st.sampled_from(allowed) if allowed and draw(st.booleans()) else _STATES)
    expected = draw(st.frozensets(_STATES, max_size=2))
    if draw(st.integers(0, 4)):
        expected |= {head.state}
    token = head.owner.token if head.owner else None
    fence = token if draw(st.integers(0, 3)) else draw(_TOKENS)
    return target, expected or frozenset({target}), draw(st.sampled_from(_FIELDS)), fence


@st.composite
def _neighbours(draw: st.DrawFn) -> tuple[HeadRow, HeadRow, tuple[Any, ...]]:
    """A run, another like it (each field of the first kept or drawn again, so that pairs
    differing in one field, the ones a key missing that field would confuse, are common) and
    an ask of the first."""
    first, other = draw(_heads()), draw(_heads())
    kept = {name: draw(st.booleans()) for name in HeadRow._fields}
    second = HeadRow(*(getattr(first if kept[n] else other, n) for n in HeadRow._fields))
    return first, second, draw(_asks(first))


@settings(max_examples=500)
@given(case=_neighbours())
def test_transitions_with_one_plan_key_get_one_write(
    case: tuple[HeadRow, HeadRow, tuple[Any, ...]],
) -> None:
    first, second, ask = case
    target, expected, fields, fence = ask
    key = sql.transition_plan_key(first, target, expected, fields, fence)
    if key == sql.transition_plan_key(second, target, expected, fields, fence):
        assert _plan(first, ask) == _plan(second, ask)


@st.composite
def _two_asks(draw: st.DrawFn) -> tuple[HeadRow, tuple[Any, ...], tuple[Any, ...]]:
    head = draw(_heads())
    return head, draw(_asks(head)), draw(_asks(head))


@settings(max_examples=500)
@given(case=_two_asks())
def test_asks_of_one_run_whose_writes_differ_have_different_plan_keys(
    case: tuple[HeadRow, tuple[Any, ...], tuple[Any, ...]],
) -> None:
    """The other half of the group's soundness: two asks of one run whose writes differ never
    share a key (else the group would write one of them for both)."""
    head, ask, other = case
    if sql.transition_plan_key(head, *ask) == sql.transition_plan_key(head, *other):
        assert _plan(head, ask) == _plan(head, other)

"""The explorer's test agent: a well-behaved toolkit that changes a real world under
``tmp_path`` (notes on disk, a payment ledger, an outbox), and ``run_explore``, which explores a
task of it with ``World.reset`` between runs. Tools report their effects with ``record_effect``,
as a user's toolkit would.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio

import haltwise
from haltwise.testing import ExploreReport, explore, record_effect

INDEX = {"cats": ["cats purr", "cats nap", "cats hunt"]}


class World:
    """The outside world the tools change: notes on disk, a payment ledger, an outbox file.

    There is one, ``WORLD`` (the tools are module-level functions); the ``world`` fixture
    (tests/analysis/conftest.py) moves it into each test's own directory with ``enter``.
    """

    root: Path  # set by ``enter``

    def __init__(self) -> None:
        self.ledger: dict[str, int] = {}
        self.starts = 0

    def enter(self, root: Path) -> None:
        """Make ``root`` the world's directory, empty: no notes, no mail, no charges."""
        self.root = root
        self.reset()

    @property
    def notes(self) -> Path:
        return self.root / "notes"

    @property
    def outbox(self) -> Path:
        return self.root / "outbox.txt"

    def reset(self) -> None:
        """Put the world back as it was before any run (the explorer's ``reset``)."""
        self.notes.mkdir(parents=True, exist_ok=True)
        for note in self.notes.iterdir():
            note.unlink()
        self.outbox.write_text("")
        self.ledger.clear()
        self.starts = 0

    def note(self, text: str) -> Path:
        return self.notes / (text.replace(" ", "_") + ".txt")


WORLD = World()


# -- a well-behaved toolkit ------------------------------------------------------------------------


@haltwise.tool(cancel="interruptible", effect="read")
async def search_index(query: str) -> list[str]:
    await anyio.sleep(0)
    return INDEX.get(query, [])


@haltwise.tool(cancel="interruptible", effect="external")
def summarize_hit(hit: str) -> str:
    """A model call in a plain function that polls for a cancel."""
    if haltwise.cancel_requested():
        raise haltwise.Cancelled()
    return hit.upper()


def delete_note(text: str) -> None:
    note = WORLD.note(text)
    if note.exists():
        note.unlink()
        record_effect("note", key=text, undo=True)


@haltwise.tool(cancel="rollback", effect="write", compensate=delete_note, grace=5.0)
def save_note(text: str) -> str:
    note = WORLD.note(text)
    note.write_text(text)
    record_effect("note", key=text)
    return note.name


@haltwise.tool(cancel="finish", effect="external", idempotent=True, grace=5.0)
async def charge_card(cents: int) -> dict[str, Any]:
    """Charges at once; the payment API recognises a key it has already served."""
    key = haltwise.idempotency_key()
    if key not in WORLD.ledger:
        WORLD.ledger[key] = cents
        record_effect("charge")
    await anyio.sleep(0)  # the receipt comes back over the network
    return {"receipt": f"r{len(WORLD.ledger)}", "cents": cents}


@haltwise.tool(cancel="finish", effect="external", grace=5.0)
async def send_receipt(to: str, text: str) -> int:
    await anyio.sleep(0)  # connect first; the mail goes out below
    with WORLD.outbox.open("a") as outbox:
        outbox.write(f"{to}: {text}\n")
    record_effect("mail")
    return len(WORLD.outbox.read_text().splitlines())


@haltwise.task
async def research(topic: str, notes: int = 2) -> dict[str, Any]:
    hits = await search_index(topic)
    saved = []
    for hit in hits[:notes]:
        summary = await summarize_hit(hit)
        haltwise.emit({"summary": summary})
        saved.append(await save_note(summary))
    bill = await charge_card(5 * len(saved))
    haltwise.emit({"charged": bill["cents"]})
    sent = await send_receipt("me@example.com", f"{len(saved)} notes, receipt {bill['receipt']}")
    return {"notes": saved, "receipt": bill["receipt"], "mails": sent}


def run_explore(task: haltwise.Task[..., Any], **kwargs: Any) -> ExploreReport:
    """``explore`` ``task`` with the input ``"cats"``, ``WORLD`` reset before every run it makes
    (``kwargs`` go on to ``explore``)."""
    return explore(task, "cats", reset=WORLD.reset, **kwargs)

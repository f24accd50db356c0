import json
import time
from pathlib import Path

import anyio

import haltwise

NOTES, OUTBOX = Path("notes.jsonl"), Path("outbox.jsonl")


@haltwise.tool(cancel="interruptible", effect="read")
async def search(query: str) -> list[str]:
    await anyio.sleep(0.2)  # a cancel lands here at once
    return [f"{query} {i}" for i in range(3)]


def delete_note(text: str) -> None:  # the compensation of save_note: drop its line
    lines = NOTES.read_text().splitlines()
    if json.dumps(text) in lines:
        del lines[len(lines) - 1 - lines[::-1].index(json.dumps(text))]
    NOTES.write_text("".join(line + "\n" for line in lines))


@haltwise.tool(cancel="rollback", effect="write", compensate=delete_note)
def save_note(text: str) -> int:  # plain functions run in a worker thread
    time.sleep(0.5)
    with NOTES.open("a") as notes:
        notes.write(json.dumps(text) + "\n")
    return len(NOTES.read_text().splitlines())


@haltwise.tool(cancel="finish", effect="external", idempotent=True, grace=10.0)
async def send_email(to: str, body: str) -> str:
    key = haltwise.idempotency_key()  # the same in every attempt: give it to the mail API
    with OUTBOX.open("a") as outbox:
        outbox.write(json.dumps({"to": to, "body": body, "key": key}) + "\n")
    return f"sent to {to}"


@haltwise.task
async def research(topic: str) -> str:
    for hit in await search(topic):
        haltwise.emit({"hit": hit})  # durable when it returns
        await save_note(hit)
    return await send_email("me@example.com", f"notes on {topic}")


async def main() -> None:
    run_id = f"research-{time.time_ns()}"  # a new run each time this script runs
    async with haltwise.Runtime("sqlite:///quickstart.db") as rt:  # default: .haltwise/
        handle = await rt.start(research, "cats", task_id=run_id, deadline=60)
        while not (await rt.status(run_id)).partials:  # let the first hit be emitted
            await anyio.sleep(0.05)
        await handle.cancel(reason="user")  # returns at once; force=True skips the grace
        outcome = await handle.outcome()  # waits for a final state
        print(outcome.state.value, outcome.reason, outcome.retry.value)
        print("kept:", outcome.partials)  # what survived
        print("steps:", [f"{s.tool}:{s.status.value}" for s in outcome.steps])
        outcome = await (await rt.resume(run_id)).outcome()  # goes on where it stopped
        print(outcome.state.value, outcome.result, len(outcome.partials), "partial results")


anyio.run(main)
outcome = haltwise.run(research, "dogs", store="sqlite:///quickstart.db")  # blocking form
print(outcome.state.value, outcome.result)

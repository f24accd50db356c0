"""Tasks served over MCP by ``haltwise mcp examples/mcp_tasks.py`` (see ``mcp_agent.py``).

``report`` emits one partial result per source (an MCP client sees them as progress
notifications) and publishes the report (``cancel="finish"``: a cancel lets it finish).
"""

from __future__ import annotations

import anyio

import haltwise


@haltwise.tool(cancel="interruptible", effect="read")
async def read_source(name: str) -> str:
    """Read one source."""
    await anyio.sleep(0.3)
    return f"notes from {name}"


@haltwise.tool(cancel="finish", effect="external", idempotent=True)
async def publish(text: str) -> str:
    """Publish the report."""
    return f"published {len(text)} characters"


@haltwise.task
async def report(topic: str) -> str:
    """Write and publish a report on a topic from three sources."""
    notes = []
    for source in ("archive", "interviews", "press"):
        notes.append(await read_source(f"{topic} {source}"))
        haltwise.emit({"read": source})
    return await publish("\n".join(notes))

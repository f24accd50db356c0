"""``haltwise mcp FILE.py``: the file's tasks as an MCP server on stdio."""

from __future__ import annotations

import click

from .base import run_async, store_option


@click.command("mcp")
@click.argument("file", metavar="FILE.py")
@store_option
def mcp_command(file: str, store: str | None) -> int:
    """Serve FILE.py's tasks as MCP tools on stdin/stdout, one run per tools/call.

    A call's _meta["haltwise/idempotency-key"] is its run id (a retried call answers from the
    same run); the client's cancel cancels the run with reason 'client'; partial results are
    sent as progress notifications.
    """
    from ..integrations._mcp_tasks import served_tasks

    served_tasks(file)  # a file that cannot be served fails here, before the MCP SDK is imported
    from ..integrations.mcp import serve

    async def main() -> int:
        await serve(file, store=store)
        return 0

    return run_async(main)

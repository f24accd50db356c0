"""haltwise and MCP, both ways (CONTRACT.md, "Framework integrations").

- :func:`remote_tools`: the tools of an MCP server (a ``mcp.client.session.ClientSession``) as
  haltwise tools, so that each remote call is a step with a cancel policy.
- :func:`serve`: a file's tasks as an MCP server on stdio (``haltwise mcp FILE.py``), one run per
  ``tools/call``.

Needs the ``mcp`` extra: ``pip install 'haltwise[mcp]'``.
"""

from __future__ import annotations

from ._common import require

require("mcp", "mcp", "mcp")

from ._mcp_client import McpToolError as McpToolError  # noqa: E402
from ._mcp_client import remote_tools as remote_tools  # noqa: E402
from ._mcp_server import IDEMPOTENCY_KEY as IDEMPOTENCY_KEY  # noqa: E402
from ._mcp_server import OUTCOME_KEY as OUTCOME_KEY  # noqa: E402
from ._mcp_server import serve as serve  # noqa: E402

__all__ = ["IDEMPOTENCY_KEY", "OUTCOME_KEY", "McpToolError", "remote_tools", "serve"]

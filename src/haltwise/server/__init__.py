"""``haltwise serve``: the HTTP API and the live dashboard (CONTRACT.md, "HTTP API and dashboard").

Built on Starlette and uvicorn: a small, well-kept ASGI toolkit and server, with nothing between
the runtime and the request (the request bodies are pydantic models, which the package already
uses; the OpenAPI document is written from them). The dashboard is plain HTML, CSS and one
script shipped in ``static/``: no build step.
"""

from __future__ import annotations

from ._app import Served, create_app
from ._auth import Role, Tokens

__all__ = ["Role", "Served", "Tokens", "create_app"]

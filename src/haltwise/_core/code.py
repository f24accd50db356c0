"""The recorded version of a run's code (CONTRACT.md, "Resume and determinism").

A run records, when it starts, a digest of the file its task was loaded from (the task's module
source when started from Python) and of the source of the tools that file can call. ``resume``
and a worker's takeover compare the file as it is now with the recorded digest.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, final

__all__ = ["CodeVersion"]


@final
@dataclass(frozen=True, slots=True)
class CodeVersion:
    """A run's code as recorded when it started: ``file`` (absolute path), ``digest`` (SHA-256
    of the file's bytes, hex), ``tools`` (each tool's name and the SHA-256 of its function's
    source), and, when read back, ``changed``: whether the file on disk differs now (None when
    that was not looked at; True also when the file is gone)."""

    file: str
    digest: str
    tools: Mapping[str, str] = field(default_factory=dict)
    changed: bool | None = None

    def to_json(self) -> dict[str, Any]:
        """The ``"code"`` object of ``status --json``: ``{"file", "digest", "tools"}`` (the
        API's run adds ``"changed"``: see ``RunDetail.to_json``)."""
        return {"file": self.file, "digest": self.digest, "tools": dict(self.tools)}

    @classmethod
    def from_inputs(cls, inputs: Mapping[str, Any]) -> CodeVersion | None:
        """The version a run's journaled inputs hold (their ``"code"``), None for a run
        recorded without one (by an older haltwise) or one that does not parse."""
        code = inputs.get("code")
        if not isinstance(code, dict):
            return None
        file, digest, tools = code.get("file"), code.get("digest"), code.get("tools", {})
        if not isinstance(file, str) or not isinstance(digest, str) or not isinstance(tools, dict):
            return None
        return cls(file, digest, {str(k): str(v) for k, v in tools.items()})

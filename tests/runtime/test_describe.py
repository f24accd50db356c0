"""Tool descriptions and parameter schemas in the OpenAI and MCP shapes."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Annotated, Any

import pydantic
import pytest

import haltwise
from haltwise import Tool
from haltwise._runtime.describe import SchemaError, describe, parameters_schema, tool_schema
from haltwise._runtime.loader import load_tools


def delete_note(text: str) -> None:
    pass


def make(**policy: Any) -> Tool[..., Any]:
    def fn() -> None:
        """Do the thing."""

    return haltwise.tool(name="thing", **policy)(fn)


# -- describe -----------------------------------------------------------------------------------


def test_describe_is_the_docstring_then_the_cancellation_sentence() -> None:
    @haltwise.tool(cancel="interruptible", effect="read")
    async def search(query: str) -> list[str]:
        """Search the index.

        Returns the titles of the hits.
        """
        return []

    assert describe(search) == (
        "Search the index.\n\nReturns the titles of the hits.\n\n"
        "Cancellation: interruptible at once; safe to stop."
    )


def test_describe_without_a_docstring_is_the_sentence_alone() -> None:
    @haltwise.tool(cancel="finish", effect="external", idempotent=True, grace=10)
    async def send(to: str) -> None:
        pass

    assert describe(send) == (
        "Cancellation: allowed to finish within 10 s if cancelled, then the task stops; idempotent."
    )


@pytest.mark.parametrize(
    ("policy", "sentence"),
    [
        ({"cancel": "interruptible", "effect": "none"}, "interruptible at once; safe to stop."),
        (
            {"cancel": "interruptible", "effect": "write"},
            "interruptible at once; an interrupted call may be half done and is repeated.",
        ),
        (
            {"cancel": "interruptible", "effect": "external", "idempotent": True},
            "interruptible at once; an interrupted call is repeated with the same key.",
        ),
        (
            {"cancel": "finish", "effect": "write", "grace": 2.5},
            "allowed to finish within 2.5 s if cancelled, then the task stops; not idempotent.",
        ),
        (
            {"cancel": "rollback", "effect": "write", "compensate": delete_note},
            "interrupted if cancelled, then undone by delete_note within 30 s.",
        ),
        (
            {"effect": "read"},
            "not declared; allowed to finish within 30 s if cancelled, then the task stops; "
            "not idempotent.",
        ),
    ],
)
def test_cancellation_sentence(policy: dict[str, Any], sentence: str) -> None:
    assert describe(make(**policy)) == f"Do the thing.\n\nCancellation: {sentence}"


# -- parameter schemas --------------------------------------------------------------------------


class Note(pydantic.BaseModel):
    text: str
    tags: list[str] = []


@haltwise.tool(cancel="rollback", effect="write", compensate=delete_note)
def save(
    title: str,
    note: Note,
    labels: list[str],
    limit: int = 3,
    folder: str | None = None,
) -> int:
    """Save a note."""
    return 1


EXPECTED_PROPERTIES = {
    "title": {"title": "Title", "type": "string"},
    "note": {"$ref": "#/$defs/Note"},
    "labels": {"title": "Labels", "type": "array", "items": {"type": "string"}},
    "limit": {"title": "Limit", "type": "integer", "default": 3},
    "folder": {
        "title": "Folder",
        "anyOf": [{"type": "string"}, {"type": "null"}],
        "default": None,
    },
}


def test_parameters_schema_from_type_hints() -> None:
    schema = parameters_schema(save)
    assert schema["type"] == "object"
    assert schema["properties"] == EXPECTED_PROPERTIES
    assert list(schema["properties"]) == ["title", "note", "labels", "limit", "folder"]
    assert schema["required"] == ["title", "note", "labels"]
    assert schema["$defs"]["Note"]["properties"]["text"] == {"title": "Text", "type": "string"}
    assert "title" not in schema


def test_string_annotations_in_a_loaded_file_are_resolved(tmp_path: Path) -> None:
    source = """
        from __future__ import annotations

        import pydantic

        import haltwise

        class Note(pydantic.BaseModel):
            text: str
            tags: list[str] = []

        def delete_note(text: str) -> None: ...

        @haltwise.tool(cancel="rollback", effect="write", compensate=delete_note)
        def save(
            title: str, note: Note, labels: list[str], limit: int = 3, folder: str | None = None
        ) -> int:
            return 1
    """
    path = tmp_path / "notes.py"
    path.write_text(textwrap.dedent(source))
    (tool,) = load_tools(path)
    assert parameters_schema(tool)["properties"] == EXPECTED_PROPERTIES


def test_self_variadics_and_unannotated_parameters() -> None:
    def method(self: object, plain, *args: int, flag: bool = False, **kwargs: str) -> None:  # type: ignore[no-untyped-def]
        pass

    tool = haltwise.tool(cancel="interruptible", effect="none")(method)
    schema = parameters_schema(tool)
    assert schema["properties"] == {
        "plain": {"title": "Plain"},
        "flag": {"title": "Flag", "type": "boolean", "default": False},
    }
    assert schema["required"] == ["plain"]


def test_parameter_names_that_clash_with_basemodel() -> None:
    def clash(model_config: str, json: int, _hidden: bool = True) -> None:
        pass

    tool = haltwise.tool(cancel="interruptible", effect="none")(clash)
    schema = parameters_schema(tool)
    assert list(schema["properties"]) == ["model_config", "json", "_hidden"]
    assert schema["required"] == ["model_config", "json"]


def test_field_descriptions_are_kept() -> None:
    def lookup(key: Annotated[str, pydantic.Field(description="the row's key")]) -> None:
        pass

    tool = haltwise.tool(cancel="interruptible", effect="read")(lookup)
    assert parameters_schema(tool)["properties"]["key"]["description"] == "the row's key"


def test_a_default_that_is_not_json_is_left_out() -> None:
    sentinel = object()

    def fn(value: int = sentinel) -> None:  # type: ignore[assignment]
        pass

    tool = haltwise.tool(cancel="interruptible", effect="none")(fn)
    schema = parameters_schema(tool)
    assert schema["properties"]["value"] == {"title": "Value", "type": "integer"}
    assert "required" not in schema


def test_unresolvable_annotation_is_a_schema_error(tmp_path: Path) -> None:
    source = """
        from __future__ import annotations
        from typing import TYPE_CHECKING
        import haltwise

        if TYPE_CHECKING:
            from decimal import Decimal

        @haltwise.tool(cancel="interruptible", effect="read")
        def price(amount: Decimal) -> None: ...
    """
    path = tmp_path / "prices.py"
    path.write_text(textwrap.dedent(source))
    (tool,) = load_tools(path)
    with pytest.raises(SchemaError, match="tool 'price': cannot read its parameters' types"):
        tool_schema(tool)


def test_type_without_a_json_schema_is_a_schema_error() -> None:
    class Connection:
        pass

    def use(connection: Connection) -> None:
        pass

    tool = haltwise.tool(cancel="interruptible", effect="read")(use)
    with pytest.raises(SchemaError, match="tool 'use'") as error:
        tool_schema(tool)
    assert error.value.tool == "use"
    assert "\n" not in str(error.value)


# -- shapes -------------------------------------------------------------------------------------


def test_openai_shape() -> None:
    schema = tool_schema(save)
    assert schema == tool_schema(save, format="openai")
    assert schema == {
        "type": "function",
        "function": {
            "name": "save",
            "description": describe(save),
            "parameters": parameters_schema(save),
        },
    }


def test_mcp_shape() -> None:
    schema = tool_schema(save, format="mcp")
    assert schema == {
        "name": "save",
        "description": describe(save),
        "inputSchema": parameters_schema(save),
        "annotations": {
            "readOnlyHint": False,
            "destructiveHint": False,
            "idempotentHint": False,
            "openWorldHint": False,
        },
    }


@pytest.mark.parametrize(
    ("policy", "read_only", "destructive", "idempotent", "open_world"),
    [
        ({"cancel": "interruptible", "effect": "none"}, True, False, False, False),
        (
            {"cancel": "interruptible", "effect": "read", "idempotent": True},
            True,
            False,
            True,
            False,
        ),
        ({"cancel": "finish", "effect": "write"}, False, True, False, False),
        ({"cancel": "finish", "effect": "external", "idempotent": True}, False, True, True, True),
        (
            {"cancel": "rollback", "effect": "write", "compensate": delete_note},
            False,
            False,
            False,
            False,
        ),
        (
            {"cancel": "rollback", "effect": "external", "compensate": delete_note},
            False,
            False,
            False,
            True,
        ),
        ({}, False, True, False, True),
    ],
)
def test_mcp_hints_follow_the_policy(
    policy: dict[str, Any], read_only: bool, destructive: bool, idempotent: bool, open_world: bool
) -> None:
    annotations = tool_schema(make(**policy), format="mcp")["annotations"]
    assert annotations == {
        "readOnlyHint": read_only,
        "destructiveHint": destructive,
        "idempotentHint": idempotent,
        "openWorldHint": open_world,
    }


def test_unknown_format() -> None:
    with pytest.raises(ValueError, match="unknown schema format 'anthropic'"):
        tool_schema(save, format="anthropic")  # type: ignore[arg-type]

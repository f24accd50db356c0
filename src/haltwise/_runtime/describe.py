"""What a model is told about a tool: its description and the JSON schema of its parameters.

:func:`describe` is the tool's docstring plus one sentence on what a cancel does to it, and
:func:`cancel_leaves` says what a cancel in the middle of a call leaves (``audit`` shows it);
:func:`tool_schema` wraps that and a JSON schema of the parameters (built with pydantic from
the type hints) in the OpenAI function-calling shape or the MCP ``tools/list`` shape.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal, cast

from .._core.exceptions import InputError, SchemaError
from .._core.policy import CancelPolicy, Effect, ToolPolicy
from .spec import ToolSpec, as_spec, spec_of

if TYPE_CHECKING:
    from pydantic.fields import FieldInfo

__all__ = [
    "SchemaError",
    "callable_name",
    "cancel_leaves",
    "cancellation_sentence",
    "describe",
    "mcp_annotations",
    "parameters_schema",
    "tool_schema",
]

SchemaFormat = Literal["openai", "mcp"]

# Parameters a JSON call cannot pass: *args and **kwargs.
_VARIADIC = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)


def describe(tool: object) -> str:
    """The tool's docstring (cleaned of indentation) followed by :func:`cancellation_sentence`.

    The two are separated by a blank line; a tool without a docstring is described by the
    sentence alone. ``tool`` is a tool function or its spec.
    """
    tool = as_spec(tool)
    doc = inspect.getdoc(tool.fn)
    sentence = cancellation_sentence(tool.policy)
    return f"{doc}\n\n{sentence}" if doc else sentence


def cancellation_sentence(policy: ToolPolicy) -> str:
    """One sentence, starting ``"Cancellation: "``, on what a cancel mid-call does to the tool.

    For example ``"Cancellation: interruptible at once; safe to stop."`` for an interruptible
    read, or ``"Cancellation: allowed to finish within 10 s if cancelled, then the task stops;
    idempotent."`` for a ``finish`` tool with ``grace=10`` and ``idempotent=True``.
    """
    match policy.cancel:
        case CancelPolicy.INTERRUPTIBLE:
            body = _interruptible(policy)
        case CancelPolicy.FINISH:
            body = _finish(policy)
        case CancelPolicy.ROLLBACK:
            body = _rollback(policy)
        case None:
            body = f"not declared; {_finish(policy)}"
    return f"Cancellation: {body}."


def _interruptible(policy: ToolPolicy) -> str:
    if not policy.effect.repeats_harm:
        return "interruptible at once; safe to stop"
    if policy.idempotent:
        return "interruptible at once; an interrupted call is repeated with the same key"
    return "interruptible at once; an interrupted call may be half done and is repeated"


def _finish(policy: ToolPolicy) -> str:
    repeat = "idempotent" if policy.idempotent else "not idempotent"
    return (
        f"allowed to finish within {policy.grace:g} s if cancelled, then the task stops; {repeat}"
    )


def _rollback(policy: ToolPolicy) -> str:
    undo = callable_name(policy.compensate) or "its compensation"
    return f"interrupted if cancelled, then undone by {undo} within {policy.grace:g} s"


def callable_name(fn: Callable[..., Any] | None) -> str | None:
    """The name a compensating function is shown by (``__name__``, or a partial's), or None."""
    if fn is None:
        return None
    name = getattr(fn, "__name__", None) or getattr(getattr(fn, "func", None), "__name__", None)
    return name if isinstance(name, str) else repr(fn)


# -- what a cancel in the middle leaves (audit's plain-words column) -----------------------


def cancel_leaves(policy: ToolPolicy) -> str:
    """In plain words, what a (non-forced) cancel in the middle of a call of this tool leaves."""
    match policy.cancel:
        case CancelPolicy.INTERRUPTIBLE:
            return _leaves_interruptible(policy)
        case CancelPolicy.FINISH:
            return _leaves_finish(policy)
        case CancelPolicy.ROLLBACK:
            return _leaves_rollback(policy)
        case None:
            return "not declared, so " + _leaves_finish(policy)


def _leaves_interruptible(policy: ToolPolicy) -> str:
    if policy.effect is Effect.READ:
        return "nothing: the read is dropped"
    if policy.effect is Effect.NONE:
        return "nothing: the call is dropped"
    done = f"perhaps part of the {_effect_noun(policy.effect)}"
    if policy.idempotent:
        return f"{done}; a resume runs it again with the same key"
    return f"{done}; a resume runs it again and may repeat it"


def _leaves_finish(policy: ToolPolicy) -> str:
    grace = _seconds(policy.grace)
    if policy.idempotent:
        return (
            f"the call completes (up to {grace}), then the task stops; a resume will not repeat it"
        )
    return (
        f"the call completes, then the task stops; if it runs past {grace} it is unknown "
        "and someone must check"
    )


def _leaves_rollback(policy: ToolPolicy) -> str:
    undo = callable_name(policy.compensate)
    if undo is None:
        return "nothing undoes it: unknown, someone must check"
    return (
        f"the {_effect_noun(policy.effect)} is undone by {undo} (within "
        f"{_seconds(policy.grace)}); if that fails it is unknown"
    )


def _effect_noun(effect: Effect) -> str:
    return {Effect.WRITE: "write", Effect.EXTERNAL: "external call"}.get(effect, "call")


def _seconds(value: float) -> str:
    return f"{value:g} s"


# -- parameter schemas ----------------------------------------------------------------------------


def tool_schema(tool: object, *, format: SchemaFormat = "openai") -> dict[str, Any]:
    """The tool as a model-facing declaration, in the OpenAI or the MCP shape.

    ``format="openai"``: ``{"type": "function", "function": {"name", "description",
    "parameters"}}`` (Chat Completions function calling). ``format="mcp"``: one entry of an MCP
    ``tools/list`` result, ``{"name", "description", "inputSchema", "annotations"}``, where the
    annotations are derived from the policy: ``readOnlyHint`` for effect ``none``/``read``;
    ``destructiveHint`` for ``write``/``external`` unless the tool is ``rollback``;
    ``idempotentHint`` from ``idempotent``; ``openWorldHint`` for ``external``.

    ``description`` is :func:`describe`; the parameter schema is :func:`parameters_schema`.
    Raises :class:`ValueError` for another ``format`` and :class:`SchemaError` if the
    parameters cannot be described.
    """
    tool = as_spec(tool)
    description = describe(tool)
    parameters = parameters_schema(tool)
    if format == "openai":
        function = {"name": tool.name, "description": description, "parameters": parameters}
        return {"type": "function", "function": function}
    if format == "mcp":
        return {
            "name": tool.name,
            "description": description,
            "inputSchema": parameters,
            "annotations": mcp_annotations(tool.policy),
        }
    raise InputError(f"unknown schema format {format!r}; expected 'openai' or 'mcp'")


def mcp_annotations(policy: ToolPolicy) -> dict[str, bool]:
    """The MCP tool annotations (behaviour hints) that follow from a tool's policy."""
    return {
        "readOnlyHint": not policy.effect.repeats_harm,
        "destructiveHint": policy.effect.repeats_harm
        and policy.cancel is not CancelPolicy.ROLLBACK,
        "idempotentHint": policy.idempotent,
        "openWorldHint": policy.effect is Effect.EXTERNAL,
    }


def parameters_schema(tool: object) -> dict[str, Any]:
    """The JSON schema (an ``object``) of the keyword arguments a call of the tool takes.

    Built with pydantic from the function's signature, string annotations evaluated (so files
    using ``from __future__ import annotations`` work). A leading ``self``/``cls`` and ``*args``/
    ``**kwargs`` are left out; a parameter without an annotation accepts anything; a parameter
    with a default is optional and shows the default (when it is JSON). ``Annotated[T,
    pydantic.Field(description=...)]`` describes a parameter. Pydantic models used as parameter
    types appear under ``$defs``. The top-level ``title`` pydantic adds is removed.
    """
    import pydantic  # here, not at import: describing a tool must not load pydantic

    tool = _with_fn(tool)
    parameters = _parameters(tool)
    fields: dict[str, Any] = {f"p{i}": _field(param) for i, param in enumerate(parameters)}
    try:
        model = pydantic.create_model(f"{tool.name}_parameters", **fields)
        schema: dict[str, Any] = model.model_json_schema(
            by_alias=True, schema_generator=_quiet_schema()
        )
    except (pydantic.PydanticUserError, pydantic.PydanticSchemaGenerationError) as error:
        first_line = str(error).splitlines()[0]
        raise SchemaError(f"tool {tool.name!r}: {first_line}", tool=tool.name) from error
    schema.pop("title", None)
    return schema


def _with_fn(tool: object) -> ToolSpec:
    """A tool's spec; a task (which has ``fn`` and ``name`` as a spec does) passes as it is."""
    spec = spec_of(tool)
    if spec is None and hasattr(tool, "fn") and hasattr(tool, "name"):
        return cast(ToolSpec, tool)
    return as_spec(tool)


@functools.cache
def _quiet_schema() -> Any:
    """Pydantic's generator, without the warning for a default that is not JSON.

    Such a default is simply left out of the schema (the parameter stays optional).
    """
    from pydantic.json_schema import GenerateJsonSchema, JsonSchemaWarningKind

    class QuietSchema(GenerateJsonSchema):
        def emit_warning(self, kind: JsonSchemaWarningKind, detail: str) -> None:
            if kind != "non-serializable-default":
                super().emit_warning(kind, detail)

    return QuietSchema


def _parameters(tool: ToolSpec) -> list[inspect.Parameter]:
    try:
        signature = inspect.signature(tool.fn, eval_str=True)
    except (NameError, SyntaxError, TypeError, ValueError) as error:
        message = f"tool {tool.name!r}: cannot read its parameters' types: {error}"
        raise SchemaError(message, tool=tool.name) from error
    params = [param for param in signature.parameters.values() if param.kind not in _VARIADIC]
    if params and params[0].name in ("self", "cls"):
        params = params[1:]
    return params


def _field(param: inspect.Parameter) -> tuple[Any, FieldInfo]:
    import pydantic

    # Every field gets a neutral name and the parameter's name as alias, so that parameters
    # called ``model_config``, ``json`` or ``_private`` do not clash with BaseModel.
    annotation = Any if param.annotation is inspect.Parameter.empty else param.annotation
    if param.default is inspect.Parameter.empty:
        return annotation, pydantic.Field(alias=param.name)
    return annotation, pydantic.Field(default=param.default, alias=param.name)

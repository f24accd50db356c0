"""What the framework adapters share: the missing-extra error and the journaled step helpers.

The adapters use the public ``haltwise`` API, with one exception: :func:`cancel_run_for_host`
reaches the current run's :class:`~haltwise.Runtime` through the run context, because the public
API offers no way for code inside a run to request a cancel of that run without raising.

Every adapter module starts with :func:`require`, so that importing it without its framework
installed raises :class:`MissingExtraError` (an :class:`ImportError` *and* a
:class:`~haltwise.HaltwiseError`) naming the extra to install, instead of a bare
``ModuleNotFoundError`` from deep inside the module.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import json
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager, nullcontext
from types import ModuleType
from typing import Any, TypeVar

import haltwise

from .._core.exceptions import HaltwiseError, install_hint
from .._runtime.budget import model_usage
from .._runtime.tool import model_step

__all__ = [
    "MODEL_STEP",
    "MissingExtraError",
    "call_id",
    "cancel_run_for_host",
    "journaled",
    "model_name",
    "model_request",
    "record_usage",
    "request_digest",
    "require",
]

T = TypeVar("T")


class MissingExtraError(HaltwiseError, ImportError):
    """An integration was imported without its framework installed.

    ``.extra`` is the name of the optional extra that installs it (``pip install
    'haltwise[EXTRA]'``); ``.module`` the framework module that could not be imported.
    """

    def __init__(self, integration: str, module: str, extra: str) -> None:
        super().__init__(
            f"haltwise.integrations.{integration} needs the {module!r} package: "
            + install_hint(extra)
        )
        self.module = module
        self.extra = extra


def require(integration: str, module: str, extra: str) -> ModuleType:
    """Import ``module`` for ``integration``, or raise :class:`MissingExtraError`.

    Only the framework itself missing counts: an error raised *inside* an installed framework
    while it imports propagates unchanged.
    """
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as error:
        if error.name is None or not (error.name == module or module.startswith(error.name + ".")):
            raise
        raise MissingExtraError(integration, module, extra) from None


# -- journaled calls -------------------------------------------------------------------------

#: The name a model request's step records (``haltwise status`` shows it as the tool).
MODEL_STEP = "model"


def call_id(value: str | None) -> AbstractContextManager[None]:
    """``haltwise.call_id(value)``: the steps begun inside are matched on replay by this id.

    A missing or empty id (a framework that did not give one) leaves the steps matched by their
    order.
    """
    return haltwise.call_id(value) if value else nullcontext()


async def model_request(
    ask: Callable[[], Awaitable[T]],
    *,
    name: str = MODEL_STEP,
    request: Any = None,
    model: Any = None,
) -> T:
    """``await ask()`` as one step of the current run (``interruptible``, ``read``).

    ``ask`` must return a JSON value (the adapters pass the framework's response as JSON and
    rebuild it): a resume returns the journaled value and does not ask the model again. Outside a
    task it just calls ``ask``.

    ``request`` is what the model is asked (the messages, the tools offered, the settings that
    change the answer; see :func:`request_digest`): the step's argument is its digest, so a
    replay whose request differs from the journal's fails the run with
    :class:`~haltwise.NonDeterminismError` naming the step, instead of handing a journaled
    answer to another request (CONTRACT.md, "Framework integrations").

    ``model`` is the model asked (its name, or an object with one: :func:`model_name`): the
    step's span is ``chat {model}``.
    """
    asked_model = model_name(model)
    if request is None:
        value: T = await model_step(ask, name=name, model=asked_model)
        return value

    async def asked(_request: str) -> T:
        return await ask()

    value = await model_step(asked, request_digest(request), name=name, model=asked_model)
    return value


def record_usage(model: Any, input_tokens: Any, output_tokens: Any) -> None:
    """The model request running as the current step used these tokens (the framework's own
    usage): journaled with the step's settlement, priced when the run's budget names the model
    (``model``: its name, or an object with one). Missing counts are 0; outside a step nothing
    is recorded (a replay returns its journaled response and spends nothing again)."""
    model_usage(model_name(model), _count(input_tokens), _count(output_tokens))


def model_name(model: Any) -> str | None:
    """The name a framework gives its model (``"gpt-4o"``), from a string or the model's own
    ``model_name`` / ``model`` / ``name`` attribute; None if it gives none."""
    if isinstance(model, str) or model is None:
        return model
    for attribute in ("model_name", "model", "name"):
        value = getattr(model, attribute, None)
        if isinstance(value, str) and value:
            return value
    return None


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def request_digest(request: Any) -> str:
    """A digest of a model request, the same in every process for the same request.

    ``request`` is JSON-like: dicts (keys in any order; a ``None`` value counts as absent),
    lists, scalars; a pydantic model or a dataclass counts as its fields, any other object as
    its type name only (its identity changes between processes). So an item the framework holds
    as a dict and the same item rebuilt as a model (a replayed response) digest alike.
    """
    text = json.dumps(_canonical(request), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


#: the exact types _canonical passes through or walks without an isinstance check (the common
#: case, a request's JSON); their subclasses take the isinstance path, to the same result
_SCALARS = frozenset({str, int, float, bool, type(None)})
_SEQUENCES = frozenset({list, tuple})


def _canonical(value: Any) -> Any:
    kind = type(value)
    if kind in _SCALARS:
        return value
    if kind is dict:
        return {str(key): _canonical(item) for key, item in value.items() if item is not None}
    if kind in _SEQUENCES:
        return [_canonical(item) for item in value]
    if isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, dict):
        return {str(key): _canonical(item) for key, item in value.items() if item is not None}
    if isinstance(value, list | tuple):
        return [_canonical(item) for item in value]
    return _canonical(_as_json(value))


#: each dataclass type's field names, as _as_json reads them (``dataclasses.fields`` is slow)
_FIELDS: dict[type, tuple[str, ...]] = {}


def _as_json(value: Any) -> Any:
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return dump(mode="json", exclude_none=True, by_alias=True)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        names = _FIELDS.get(type(value))
        if names is None:
            names = _FIELDS[type(value)] = tuple(f.name for f in dataclasses.fields(value))
        return {name: getattr(value, name) for name in names}
    if isinstance(value, set | frozenset):
        return sorted(map(str, value))
    kind = type(value)
    return f"<{kind.__module__}.{kind.__qualname__}>"


async def journaled(fn: Callable[[], Awaitable[T]], *, name: str, **policy: Any) -> T:
    """``await fn()`` as one step named ``name`` with the ``@haltwise.tool`` keywords ``policy``
    (``haltwise.step``); ``fn`` returns a JSON value, which a replay returns without calling it."""
    value: T = await haltwise.step(fn, name=name, **policy)
    return value


async def cancel_run_for_host() -> None:
    """Cancel the current run with reason ``host``: the framework stopped the agent quietly
    (:func:`haltwise.cancel_current_run`; a framework cancel that raises into the task, or
    reaches a step, is the core's host-cancel rule)."""
    await haltwise.cancel_current_run("host")

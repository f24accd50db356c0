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

import importlib
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager, nullcontext
from types import ModuleType
from typing import Any, TypeVar

import haltwise

from .._core.exceptions import HaltwiseError
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
            f"pip install 'haltwise[{extra}]'"
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


async def model_request(ask: Callable[[], Awaitable[T]], *, name: str = MODEL_STEP) -> T:
    """``await ask()`` as one step of the current run (``interruptible``, ``read``).

    ``ask`` must return a JSON value (the adapters pass the framework's response as JSON and
    rebuild it): a resume returns the journaled value and does not ask the model again. Outside a
    task it just calls ``ask``.
    """
    value: T = await model_step(ask, name=name)
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

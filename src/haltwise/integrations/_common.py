"""What the framework adapters share: the missing-extra error and the journaled step helpers.

Every adapter module starts with :func:`require`, so that importing it without its framework
installed raises :class:`MissingExtraError` (an :class:`ImportError` *and* a
:class:`~haltwise.HaltwiseError`) naming the extra to install, instead of a bare
``ModuleNotFoundError`` from deep inside the module.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from .._core.exceptions import HaltwiseError

__all__ = ["MissingExtraError", "require"]


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

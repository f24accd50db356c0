"""The ``haltwise`` command line (CONTRACT.md, "Command line"). The only package that knows click.

Each command is one small function in a module of this package (:mod:`.runs`, :mod:`.operate`,
:mod:`.work`, :mod:`.verify`...), named in :data:`COMMANDS` here, explicitly, and imported only
when it runs, so that no module imports another for its side effects and a command that only
reads or requests starts fast. Shared options and exit codes live in :mod:`.base`.
"""

from __future__ import annotations

import importlib
import logging
import sys
from collections.abc import Sequence
from typing import NoReturn

import click

from .. import __version__
from .._core.exceptions import HaltwiseError, ResumeRefusedError, UnknownRunError
from .base import USAGE, fail, looked_in

__all__ = ["cli", "main", "run_cli"]


#: Every command: its name, and the module of this package and the function that make it. A
#: command's module is imported only when that command runs (or the help lists them all), so
#: ``haltwise cancel ID`` loads what cancelling needs and nothing of ``run``, ``serve``, ``mcp``
#: or ``explore``.
COMMANDS = {
    "run": ("runs", "run_command"),
    "cancel": ("cancel", "cancel_command"),
    "prune": ("operate", "prune_command"),
    "status": ("operate", "status_command"),
    "resume": ("runs", "resume_command"),
    "reconcile": ("runs", "reconcile_command"),
    "list": ("operate", "list_command"),
    "audit": ("runs", "audit_command"),
    "serve": ("serve", "serve_command"),
    "pause": ("verbs", "pause_command"),
    "unpause": ("verbs", "unpause_command"),
    "fork": ("verbs", "fork_command"),
    "submit": ("work", "submit_command"),
    "worker": ("work", "worker_command"),
    "check": ("verify", "check_command"),
    "explore": ("verify", "explore_command"),
    "mcp": ("mcp", "mcp_command"),
    "events": ("events", "events_command"),
    "approve": ("decide", "approve_command"),
    "refuse": ("decide", "refuse_command"),
}


class _Commands(click.Group):
    """The ``haltwise`` group: each command imported from :data:`COMMANDS` when it is asked for."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        where = COMMANDS.get(cmd_name)
        if where is None:
            return None
        module = importlib.import_module(f"{__name__}.{where[0]}")
        command: click.Command = getattr(module, where[1])
        return command


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="haltwise")
def cli() -> None:
    """Run multi-step agent tasks that can be stopped early, on purpose.

    Exit codes: 0 completed (or the command did its job), 1 failed, 3 cancelled,
    2 bad usage or bad input.
    """


#: Loggers whose records are not for the command line's user: psycopg_pool logs every failed
#: reconnection during a PostgreSQL outage (some twenty lines before the one clear error).
QUIET_LOGGERS = ("psycopg.pool",)


def run_cli(argv: Sequence[str] | None = None) -> int:
    """Run the command line with ``argv`` (default ``sys.argv[1:]``) and return the exit code."""
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.CRITICAL)
    try:
        code = cli.main(args=argv, prog_name="haltwise", standalone_mode=False)
    except click.UsageError as error:
        if type(error).__name__ == "NoArgsIsHelpError" and error.ctx is not None:
            # bare ``haltwise``: the help is the answer (click >= 8.2 raises it as an error)
            click.echo(error.ctx.get_help(), err=True)
            return USAGE
        hint = f" (see '{error.ctx.command_path} --help')" if error.ctx is not None else ""
        return fail(error.format_message() + hint)
    except click.ClickException as error:
        return fail(error.format_message())
    except UnknownRunError as error:
        return fail(f"{error} ({looked_in()})")
    except ResumeRefusedError as error:
        return fail(_refused_words(error))
    except HaltwiseError as error:
        return fail(str(error))
    except (click.Abort, KeyboardInterrupt):
        return 130
    return code if isinstance(code, int) else 0


def main() -> NoReturn:
    """The ``haltwise`` console script."""
    code = run_cli()
    signals = sys.modules.get(f"{__name__}.signals")  # installed only by a command that imported it
    if signals is not None:
        signals.RELAY.ignore_from_now()  # the exit code is the run's, whatever signal comes now
    sys.exit(code)


def _refused_words(error: ResumeRefusedError) -> str:
    """A refused resume, with the options of ``haltwise resume`` that settle it."""
    from .._runtime.explain import refused_words  # (only when a resume is refused)

    return refused_words(error.task_id or "", error.steps, "cli")

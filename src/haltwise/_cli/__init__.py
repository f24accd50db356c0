"""The ``haltwise`` command line (CONTRACT.md, "Command line"). The only package that knows click.

Each command is one small function in a module of this package (:mod:`.runs`, :mod:`.work`,
:mod:`.verify`), registered on the :func:`cli` group here, explicitly, so that no module imports
another for its side effects. Shared options and exit codes live in :mod:`.base`.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from typing import NoReturn

import click

from .. import __version__
from .._core.exceptions import HaltwiseError, UnknownRunError
from . import mcp, runs, serve, verbs, verify, work
from .base import USAGE, fail, looked_in
from .signals import RELAY

__all__ = ["cli", "main", "run_cli"]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="haltwise")
def cli() -> None:
    """Run multi-step agent tasks that can be stopped early, on purpose.

    Exit codes: 0 completed (or the command did its job), 1 failed, 3 cancelled,
    2 bad usage or bad input.
    """


for _command in (
    runs.run_command,
    runs.cancel_command,
    runs.prune_command,
    runs.status_command,
    runs.resume_command,
    runs.list_command,
    runs.audit_command,
    serve.serve_command,
    verbs.pause_command,
    verbs.unpause_command,
    verbs.fork_command,
    work.submit_command,
    work.worker_command,
    verify.check_command,
    verify.explore_command,
    mcp.mcp_command,
):
    cli.add_command(_command)


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
    except HaltwiseError as error:
        return fail(str(error))
    except (click.Abort, KeyboardInterrupt):
        return 130
    return code if isinstance(code, int) else 0


def main() -> NoReturn:
    """The ``haltwise`` console script."""
    code = run_cli()
    RELAY.ignore_from_now()  # the exit code is the run's, whatever signal comes now
    sys.exit(code)

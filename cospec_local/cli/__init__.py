"""The `cospec-local` command line: generate, chat, serve, bench, eval, models.

Flags follow llama.cpp's where one exists (-m, -md, -p, -n, -c, -t, --temp, --seed).

One module per job: group (the click group, llama.cpp's flags read whole, Ollama's verbs),
options (the options commands share), drafts (which draft model to load), loading (opening the
engine), and the commands: generation (generate, chat), serving (serve, rpc-server), measuring
(calibrate, bench, eval), listing (devices, models) and arbiter_commands (arbiter ...).
"""
from __future__ import annotations

import sys
import warnings

import click

from ..errors import ArbiterSettingsWarning, CalibrationNotice
# Each command module registers its commands on main as it is imported.
from . import arbiter_commands, generation, listing, measuring, serving  # noqa: F401
from .group import main
from .loading import chat_banner

__all__ = ["chat_banner", "main", "run"]


def _show_warning(message, category, filename, lineno, file=None, line=None):
    """The engine's own warnings as one plain note; any other in Python's format."""
    if issubclass(category, (ArbiterSettingsWarning, CalibrationNotice)):
        click.echo(f"note: {message}", err=True)
    else:
        _python_showwarning(message, category, filename, lineno, file, line)


_python_showwarning = warnings.showwarning


def run() -> None:
    """The console entry point: click's own handling, except that an interrupt anywhere
    (loading, a second Ctrl-C) exits 130 quietly, as a shell expects, not "Aborted!" and 1."""
    warnings.showwarning = _show_warning
    try:
        main.main(standalone_mode=False)
    except (click.exceptions.Abort, KeyboardInterrupt):
        sys.exit(130)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)

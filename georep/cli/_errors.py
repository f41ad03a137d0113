"""How every command reports a mistake it can name: one line, red, then an exit status.

The line is printed verbatim, never read as rich markup: it often quotes what the user
typed (a fault kind, a path, an option's value), and text such as ``[/x]`` read as markup
crashed the command with a ``MarkupError`` traceback, while ``[bold]`` vanished from the
quoted value.
"""

from __future__ import annotations

__all__ = ["fail", "print_error"]

import typer
from rich.console import Console


def print_error(console: Console, message: str) -> None:
    """Print ``message`` on ``console`` in red, verbatim but for secrets (a key, a SAS
    signature, a URL's password: an option's value quoted back)."""
    from georep._secrets import mask_secrets

    console.print(mask_secrets(message), style="red", soft_wrap=True, markup=False, highlight=False)


def fail(console: Console, message: str, status: int = 2) -> typer.Exit:
    """Print ``error: message`` on ``console`` and return the exit to raise (status 2: the
    command was given something it cannot use; 1: it could not do its work)."""
    print_error(console, f"error: {message}")
    return typer.Exit(status)

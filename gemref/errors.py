"""User mistakes versus bugs.

`UsageError` is raised for a mistake in what the user gave (a flag, a config value, a path, a
file they named). The `gemref` command turns it into one line on stderr and exit status 2;
any other exception is a bug in gemref and keeps its traceback (exit status 1).

It subclasses ValueError, so code and tests that expect a ValueError for bad input still work.
Nothing here imports another gemref module: every layer may raise it.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator


class UsageError(ValueError):
    """A mistake in user input: the CLI prints `gemref CMD: error: <message>` and exits 2."""


@contextmanager
def user_input() -> Iterator[None]:
    """Treat a ValueError raised inside the block as the user's mistake (a UsageError).

    Wrap only code that checks what the user gave (e.g. parsing a flag with a library
    function that raises ValueError), never the work itself: a ValueError from a bug there
    would be reported as a user mistake without its traceback.
    """
    try:
        yield
    except UsageError:
        raise
    except ValueError as e:
        raise UsageError(str(e)) from e

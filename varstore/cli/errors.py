"""Errors the command line reports itself: bad arguments, and features that need an optional extra."""

from __future__ import annotations

import importlib
from types import ModuleType

USAGE_EXIT_CODE = 2
FAILURE_EXIT_CODE = 1


class CommandError(Exception):
    """A problem to report in one line on stderr, with the exit code it deserves."""

    exit_code = FAILURE_EXIT_CODE


class UsageError(CommandError):
    """An argument is wrong in a way argparse cannot see (a range, an index, an option that does not apply)."""

    exit_code = USAGE_EXIT_CODE


def require_extra(module: str, extra: str, feature: str) -> ModuleType:
    """Import an optional dependency, or say which varstore extra brings it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise CommandError(f"{feature} needs {module}: pip install 'varstore[{extra}]'") from None

"""The directory a command writes a dataset into: what it created is removed again when the command fails."""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Iterator


def _missing_directories(path: str) -> list[str]:
    """`path` and those of its parents that do not exist yet, deepest first."""
    missing = []
    path = os.path.abspath(path)
    while not os.path.lexists(path):
        missing.append(path)
        path = os.path.dirname(path)
    return missing


@contextmanager
def removed_if_created_and_failed(directory: str) -> Iterator[None]:
    """If the block fails, remove `directory` and the parents missing when it began, deepest first.

    Only empty directories are removed (``rmdir``), so nothing another process
    put there, and no directory that existed before, is ever deleted.
    """
    created = _missing_directories(directory)
    try:
        yield
    except BaseException:
        for path in created:
            try:
                os.rmdir(path)
            except OSError:
                break
        raise

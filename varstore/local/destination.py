"""The directory a command or operation (copy, merge, convert) writes a dataset into: what may already be there,
and what is removed again when the operation fails."""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Iterator

from ..errors import CommandError, listing
from ..format.manifest import MANIFEST_NAME
from .journal import JOURNAL_NAME
from .locks import DIRECTORY_LOCK_NAME, LOCK_SUFFIX
from .publish import TEMP_MARK, make_directories

__all__ = ["ALLOW_OTHER_FILES_OPTION", "check_destination", "is_dataset_file", "make_directories",
           "removed_if_created_and_failed"]

ALLOW_OTHER_FILES_OPTION = "--allow-other-files"


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


def is_dataset_file(name: str) -> bool:
    """A name varstore writes in a dataset directory: manifest, shard files, journal, locks, temporary files."""
    return (name in (MANIFEST_NAME, JOURNAL_NAME) or name.endswith((".data", ".index", LOCK_SUFFIX))
            or TEMP_MARK in name)


def check_destination(directory: str, *, command: str, keeps_dataset: bool, allow_other_files: bool) -> None:
    """Refuse a DST that holds what `command` must not write beside, so that its shards never land among a user's files.

    A directory holding files that are not a dataset's is refused unless `allow_other_files`,
    except beside a dataset (manifest.json) that the command may replace (`keeps_dataset`: the
    writer itself then decides, and needs --overwrite); a dataset's files are refused unless `keeps_dataset`.
    """
    names = sorted(set(os.listdir(directory)) - {DIRECTORY_LOCK_NAME})
    ours = [name for name in names if is_dataset_file(name)]
    others = [name for name in names if not is_dataset_file(name)]
    if ours and not keeps_dataset:
        raise CommandError(f"{directory}: exists and is not empty: it holds a dataset's files ({listing(ours, 5)}); "
                           f"{command} writes a new dataset")
    if others and not allow_other_files and not (keeps_dataset and MANIFEST_NAME in ours):
        raise CommandError(f"{directory}: exists and is not empty: it holds files that are not a dataset's "
                           f"({listing(others, 5)}); {command} writes a dataset into a new or empty directory; "
                           f"pass {ALLOW_OTHER_FILES_OPTION} to write beside them")

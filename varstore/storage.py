"""Operating-system file work shared by the writers: durable writes, atomic publication, temporary names.

Every write, fsync and rename goes through `os` functions so that tests can inject
faults (ENOSPC, EIO) at each call, and every OSError becomes a `StorageError`.
"""

from __future__ import annotations

import glob
import os
import secrets

from .errors import ShardExistsError, StorageError

TEMP_MARK = ".varstore-tmp-"


def temporary_path(final_path: str) -> str:
    """A unique name beside `final_path` that `remove_temporary_files` recognises."""
    return f"{final_path}{TEMP_MARK}{secrets.token_hex(6)}"


def remove_temporary_files(directory: str) -> list[str]:
    """Delete the temporary files that interrupted writers left in `directory`; returns their paths."""
    removed = []
    for path in sorted(glob.glob(os.path.join(glob.escape(directory), f"*{TEMP_MARK}*"))):
        try:
            os.unlink(path)
        except FileNotFoundError:
            continue
        removed.append(path)
    return removed


def write_all(fd: int, data: bytes | bytearray | memoryview) -> None:
    """Write every byte of `data`, continuing after short writes."""
    view = memoryview(data).cast("B")
    while view:
        written = os.write(fd, view)
        view = view[written:]


def fsync_directory(directory: str) -> None:
    """Make the entries of `directory` (new names, renames) durable."""
    fd = os.open(directory or ".", os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sync_directory(directory: str) -> None:
    """`fsync_directory` after a commit: a failure is a StorageError, and the commit stays visible."""
    try:
        fsync_directory(directory)
    except OSError as error:
        raise StorageError(
            f"committed, but fsync of the directory failed ({error.strerror or error}): the commit may not survive a power loss",
            path=directory,
        ) from None


def make_directories(directory: str) -> None:
    """Create `directory` and its missing parents, durably."""
    directory = os.path.abspath(directory)
    missing = []
    while not os.path.isdir(directory):
        missing.append(directory)
        directory = os.path.dirname(directory)
    for path in reversed(missing):
        try:
            os.mkdir(path)
        except FileExistsError:
            continue
        fsync_directory(os.path.dirname(path))


def publish(renames: list[tuple[str, str]], *, overwrite: bool) -> None:
    """Rename each (temporary, final) pair in order, then fsync the directories.

    The caller orders the pairs so that the last rename is the commit point:
    until it happens, no reader can see a complete new shard. If a rename before
    it fails, the files already renamed are removed, so no half-published pair is
    left under the final names; a failure of the directory fsync after the commit
    point leaves the complete files in place. When overwriting, the file at the
    commit point is removed first, so the old one never pairs with new files.
    """
    if not overwrite:
        for _, final in renames:
            if os.path.exists(final):
                raise ShardExistsError("already exists; pass overwrite=True to replace it", path=final)
    else:
        remove_quietly([renames[-1][1]])
    renamed = []
    try:
        for temporary, final in renames:
            os.replace(temporary, final)
            renamed.append(final)
    except OSError:
        remove_quietly(renamed)
        raise
    for directory in sorted({os.path.dirname(final) for _, final in renames}):
        sync_directory(directory)


def remove_quietly(paths: list[str]) -> None:
    """Best-effort removal of temporary files after a failure; never raises."""
    for path in paths:
        try:
            os.unlink(path)
        except OSError:
            pass


def storage_error(error: OSError, action: str) -> StorageError:
    """Wrap an OSError with what varstore was doing and which file."""
    path = error.filename if isinstance(error.filename, str) else None
    return StorageError(f"{action} failed: {error.strerror or error}", path=path)

"""Operating-system file work shared by the writers: durable writes, atomic publication, temporary names.

Every write, fsync and rename goes through `os` functions so that tests can inject
faults (ENOSPC, EIO) at each call, and every OSError becomes a `StorageError`.
"""

from __future__ import annotations

import errno
import os
import secrets

from ..errors import ShardExistsError, StorageError, VarstoreError
from .locks import directory_lock_path, is_locked, shard_lock_path

TEMP_MARK = ".varstore-tmp-"
_SHARD_FILE_SUFFIXES = (".index.checksums", ".index", ".data")
# link() refusals that mean "this filesystem has no hard links here", not "the name is taken".
_NO_HARD_LINKS = {errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EXDEV, errno.EMLINK, errno.ENOSYS}
# ... and, for linking a file the caller only reads (another user's, say), the refusal to link what we do not own.
_NO_LINK_TO_SOURCE = _NO_HARD_LINKS | {errno.EACCES}


def hard_link(source: str, destination: str) -> bool:
    """Hard-link `source` as `destination`; False where these filesystems allow no link (the caller copies)."""
    try:
        os.link(source, destination, follow_symlinks=True)
        return True
    except OSError as error:
        if error.errno not in _NO_LINK_TO_SOURCE:
            raise
        return False


def temporary_path(final_path: str) -> str:
    """A unique name beside `final_path` that `remove_temporary_files` recognises."""
    return f"{final_path}{TEMP_MARK}{secrets.token_hex(6)}"


def remove_temporary_files(directory: str, *, holding_directory_lock: bool = False) -> list[str]:
    """Delete the temporary files that interrupted writers left in `directory`; returns their paths.

    Nothing is deleted while another process holds the directory's lock: a dataset
    writer, merge or repair may own any temporary file there. A temporary shard file
    whose shard lock is held is left alone too: writers take their lock before
    creating any temporary file. A writer that holds the directory lock itself says
    so with `holding_directory_lock`.
    """
    removed: list[str] = []
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return removed
    # Listed before the lock is checked: a writer that locks the directory later creates only new names.
    if not holding_directory_lock and is_locked(directory_lock_path(directory)):
        return removed
    for path in sorted(os.path.join(directory, name) for name in names if TEMP_MARK in name):
        shard_lock = _shard_lock_path(path)
        if shard_lock is not None and is_locked(shard_lock):
            continue
        try:
            os.unlink(path)
        except (FileNotFoundError, PermissionError):
            continue  # gone already, or another user's in a sticky directory: not ours to remove
        removed.append(path)
    return removed


def _shard_lock_path(temporary: str) -> str | None:
    """The lock a live writer of the temporary shard file `temporary` holds; None for other temporary files."""
    final = temporary[: temporary.index(TEMP_MARK, len(os.path.dirname(temporary)))]
    for suffix in _SHARD_FILE_SUFFIXES:
        if final.endswith(suffix):
            return shard_lock_path(final[: -len(suffix)])
    return None


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
    """Give each (temporary, final) pair its final name, in order, then fsync the directories.

    The caller has fsynced every file and orders the pairs so that the last is
    the commit point: until it is named, no reader can see a complete new shard.
    If naming a pair before it fails, the names this call gave are removed, so no
    half-published pair is left under the final names; a failure of the directory
    fsync after the commit point leaves the complete files in place.

    Without `overwrite` nothing existing is ever replaced: each file is hard-linked
    to its final name, which fails atomically if the name exists (`ShardExistsError`),
    and the temporary name is removed afterwards. On a filesystem without hard links
    the names are checked, then renamed: atomic only because writers hold their lock.
    With `overwrite` the file at the commit point is removed first, so the old one
    never pairs with new files, then each file is renamed over its final name.
    """
    if overwrite:
        remove_quietly([renames[-1][1]])
        _rename_each(renames)
    else:
        publish_new(renames)
    for directory in sorted({os.path.dirname(final) for _, final in renames}):
        sync_directory(directory)


def publish_new(renames: list[tuple[str, str]]) -> None:
    """Name each temporary file, in order, without replacing any existing file (see `publish`); no directory fsync."""
    linked: list[str] = []
    try:
        for temporary, final in renames:
            os.link(temporary, final)
            linked.append(final)
    except FileExistsError:
        remove_quietly(linked)
        raise ShardExistsError("already exists; pass overwrite=True to replace it", path=final) from None
    except OSError as error:
        remove_quietly(linked)
        if error.errno not in _NO_HARD_LINKS:
            raise
        for _, final in renames:
            if os.path.lexists(final):
                raise ShardExistsError("already exists; pass overwrite=True to replace it", path=final) from None
        _rename_each(renames)
        return
    remove_quietly([temporary for temporary, _ in renames])


def _rename_each(renames: list[tuple[str, str]]) -> None:
    renamed: list[str] = []
    try:
        for temporary, final in renames:
            os.replace(temporary, final)
            renamed.append(final)
    except OSError:
        remove_quietly(renamed)
        raise


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


def refuse_in_a_forked_child(owner_pid: int, path: str) -> None:
    """Refuse to commit a writer in a process other than the one that created it: after a fork both hold
    the same temporary files and lock, and only the parent may publish them."""
    if os.getpid() != owner_pid:
        raise VarstoreError(
            f"this writer belongs to process {owner_pid}; a forked process ({os.getpid()}) cannot commit it", path=path
        )

"""Single-writer locks: at most one writer per dataset directory and per shard, enforced by the OS.

A lock is an exclusive ``flock`` on a small lock file. The kernel releases it
when its process exits, however it exits (SIGKILL included), so a lock is never
stale. The holder writes its pid and host into the file, so the writer that is
refused can name it. The file is unlinked on release; a writer that locked a
file just as its holder unlinked it notices that the path no longer names the
file it locked and starts over, so two writers never both hold "the" lock.

``flock`` is advisory and local to one kernel: writers on different machines
sharing a network filesystem are excluded only where that filesystem forwards
``flock`` (NFSv4 on Linux does; some FUSE and SMB mounts silently do not).
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import time
from typing import Any

from .errors import ConcurrentWriterError, StorageError

LOCK_SUFFIX = ".varstore-lock"
DIRECTORY_LOCK_NAME = LOCK_SUFFIX
_HOLDER_BYTES = 256
_PROBE_RETRIES = 3


def directory_lock_path(directory: str) -> str:
    """The lock file of a dataset directory."""
    return os.path.join(directory, DIRECTORY_LOCK_NAME)


def shard_lock_path(prefix: str) -> str:
    """The lock file of the shard whose files are ``prefix.data`` and ``prefix.index``."""
    return prefix + LOCK_SUFFIX


class WriterLock:
    """An exclusive lock held on `path` until `release` (or the process's end).

    `what` names the thing locked in the error a second writer gets, e.g.
    "dataset directory out/train".
    """

    def __init__(self, path: str, what: str) -> None:
        self.path = path
        self._fd = -1
        while self._fd < 0:
            fd = self._open()
            try:
                _flock_exclusive(fd)
            except OSError as error:
                holder = _read_holder(fd)
                os.close(fd)
                if error.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                    raise ConcurrentWriterError(
                        f"another writer is writing this {what} ({holder or 'holder unknown'}); "
                        "varstore allows one writer at a time",
                        path=path,
                    ) from None
                raise StorageError(f"cannot lock {what}: {error.strerror or error}", path=path) from None
            if _names_same_file(fd, path):
                self._fd = fd
            else:
                os.close(fd)  # the previous holder unlinked it between our open and our lock: try again
        try:
            os.ftruncate(self._fd, 0)
            os.pwrite(self._fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
        except OSError as error:
            self.release()  # a disk that cannot take these few bytes cannot take the writer's files either
            raise StorageError(f"cannot write the writer lock: {error.strerror or error}", path=path) from None

    def _open(self) -> int:
        try:
            return os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as error:
            raise StorageError(f"cannot create the writer lock: {error.strerror or error}", path=self.path) from None

    @property
    def held(self) -> bool:
        return self._fd >= 0

    def release(self) -> None:
        """Unlink the lock file, then let go of the lock; a second call does nothing."""
        if self._fd < 0:
            return
        fd, self._fd = self._fd, -1
        try:
            os.unlink(self.path)
        except OSError:
            pass
        os.close(fd)

    def __enter__(self) -> "WriterLock":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.release()

    def __del__(self) -> None:
        self.release()


def lock_directory(directory: str) -> WriterLock:
    """Lock a dataset directory for one writer (`ShardedWriter`, `write_manifest`, merge, repair, ...)."""
    return WriterLock(directory_lock_path(directory), f"dataset directory {directory}")


def lock_shard(prefix: str) -> WriterLock:
    """Lock one shard name for one `Writer`."""
    return WriterLock(shard_lock_path(prefix), f"shard {prefix}")


def is_locked(path: str) -> bool:
    """Whether a live writer holds the lock file `path` (for cleanup that must not touch a live writer's files)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    except OSError as error:
        raise StorageError(f"cannot check the writer lock: {error.strerror or error}", path=path) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)
    return False


def _flock_exclusive(fd: int) -> None:
    """Take the exclusive lock without waiting for a writer, but past an `is_locked` probe, which holds a
    shared lock for microseconds: a few tries a millisecond apart tell the two apart."""
    for _ in range(_PROBE_RETRIES):
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            time.sleep(0.001)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)


def _names_same_file(fd: int, path: str) -> bool:
    try:
        held, named = os.fstat(fd), os.stat(path)
    except FileNotFoundError:
        return False
    return (held.st_dev, held.st_ino) == (named.st_dev, named.st_ino)


def _read_holder(fd: int) -> str:
    try:
        return os.pread(fd, _HOLDER_BYTES, 0).decode("utf-8", "replace").strip()
    except OSError:
        return ""

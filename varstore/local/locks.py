"""Single-writer locks: at most one writer per dataset directory and per shard, enforced by the OS.

A lock is an exclusive ``flock`` on a small lock file. The kernel releases it
when its process exits, however it exits (SIGKILL included), so a lock is never
stale. The holder writes its pid and host into the file, so the writer that is
refused can name it. The file is unlinked on release; a writer that locked a
file just as its holder unlinked it notices that the path no longer names the
file it locked and starts over, so two writers never both hold "the" lock.

Lock files are opened without following symlinks and without blocking, and
anything but a regular file at a lock path is refused, so a planted symlink or
FIFO can neither redirect the writes nor hang a writer. A lock object belongs
to the process that took it: a forked child inherits the flock but never
releases or unlinks it, so a child's exit cannot unlock its parent.

``flock`` is advisory and local to one kernel: writers on different machines
sharing a network filesystem are excluded only where that filesystem forwards
``flock`` (NFSv4 on Linux does; some FUSE and SMB mounts silently do not).
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import stat
import time
import weakref
from typing import Any

from ..errors import ConcurrentWriterError, StorageError, VarstoreError

LOCK_SUFFIX = ".varstore-lock"
DIRECTORY_LOCK_NAME = LOCK_SUFFIX
_HOLDER_BYTES = 256
_PROBE_RETRIES = 1000
_OPEN_FLAGS = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


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

    def __init__(self, path: str, what: str, *, record_holder: bool = True) -> None:
        self.path = path
        self._pid = os.getpid()
        self._fd = self._pending = -1
        self._writable = True
        try:
            self._acquire(what)
        except BaseException as error:
            if not isinstance(error, VarstoreError):  # an interrupt (Ctrl-C): leave no lock file behind
                self._abandon()
            raise
        if not (self._writable and record_holder):
            return  # another user's file left by a dead writer, or a lock nobody names (it must work on a full disk)
        try:
            os.ftruncate(self._fd, 0)
            os.pwrite(self._fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
        except BaseException as error:
            self.release()  # a disk that cannot take these few bytes cannot take the writer's files either
            if isinstance(error, OSError):
                raise StorageError(f"cannot write the writer lock: {error.strerror or error}", path=path) from None
            raise

    def _acquire(self, what: str) -> None:
        """Open and lock the lock file, again if its holder unlinked it meanwhile; the descriptor in hand is
        `self._pending` until it is locked and known to be the file the path names."""
        while self._fd < 0:
            fd = self._open()
            try:
                _flock_exclusive(fd)
            except OSError as error:
                holder = _read_holder(fd)
                self._pending = -1
                os.close(fd)
                if error.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                    raise ConcurrentWriterError(
                        f"another writer is writing this {what} ({holder or 'holder unknown'}); "
                        "varstore allows one writer at a time",
                        path=self.path,
                    ) from None
                raise StorageError(f"cannot lock {what}: {error.strerror or error}", path=self.path) from None
            if _names_same_file(fd, self.path):
                self._fd = fd
                _HELD.add(self)
            else:
                os.close(fd)  # the previous holder unlinked it between our open and our lock: try again
            self._pending = -1

    def _abandon(self) -> None:
        """Let go of whatever an interrupted start holds: the lock and its file if it got them, else the lock
        file if no writer holds it — the interrupt may have landed right after `open` created it, before the
        descriptor was kept (no live writer needs an unheld lock file; one opening it meanwhile sees it
        unlinked after locking, as after a release, and tries again)."""
        if self._fd >= 0:
            self.release()
            return
        fd, self._pending = self._pending, -1
        try:
            if fd < 0:
                fd = os.open(self.path, os.O_RDONLY | _OPEN_FLAGS)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if _names_same_file(fd, self.path):
                os.unlink(self.path)
        except OSError:
            pass
        finally:
            if fd >= 0:
                os.close(fd)

    def _open(self) -> int:
        """Open (creating) the lock file, as `self._pending`; read-only if it is another user's, since flock needs
        no write access."""
        try:
            self._pending = fd = os.open(self.path, os.O_RDWR | os.O_CREAT | _OPEN_FLAGS, 0o644)
            self._writable = True
        except PermissionError as denied:
            try:
                self._pending = fd = os.open(self.path, os.O_RDONLY | _OPEN_FLAGS)
            except OSError:
                raise _open_error(denied, "cannot create the writer lock", self.path) from None
            self._writable = False
        except OSError as error:
            raise _open_error(error, "cannot create the writer lock", self.path) from None
        _refuse_unless_regular(fd, self.path)
        return fd

    @property
    def held(self) -> bool:
        return self._fd >= 0

    def release(self) -> None:
        """Unlink the lock file (if the path still names it), then let go of the lock; a second call, or a call
        in a forked child, does nothing."""
        if self._fd < 0 or os.getpid() != self._pid:
            return
        fd, self._fd = self._fd, -1
        _HELD.discard(self)
        if _names_same_file(fd, self.path):
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


def lock_waiting(path: str, what: str, *, record_holder: bool = True) -> WriterLock:
    """`WriterLock(path, what)`, waiting while another process or thread holds it: a blocking shared flock
    on the held file returns as soon as the holder releases it or dies."""
    while True:
        try:
            return WriterLock(path, what, record_holder=record_holder)
        except ConcurrentWriterError:
            pass
        try:
            fd = os.open(path, os.O_RDONLY | _OPEN_FLAGS)
        except FileNotFoundError:
            continue  # released (and unlinked) meanwhile
        except OSError as error:
            raise _open_error(error, f"cannot wait for the lock of {what}", path) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
        finally:
            os.close(fd)


def is_locked(path: str) -> bool:
    """Whether a live writer holds the lock file `path` (for cleanup that must not touch a live writer's files)."""
    try:
        fd = os.open(path, os.O_RDONLY | _OPEN_FLAGS)
    except FileNotFoundError:
        return False
    except OSError as error:
        raise _open_error(error, "cannot check the writer lock", path) from None
    _refuse_unless_regular(fd, path)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)
    return False


def _flock_exclusive(fd: int) -> None:
    """Take the exclusive lock without waiting for a writer, but past `is_locked` probes, which hold shared
    locks for microseconds: while a shared lock can be had, no writer holds the file, so try again."""
    for _ in range(_PROBE_RETRIES):
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            pass
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # refused: a writer holds the exclusive lock
        fcntl.flock(fd, fcntl.LOCK_UN)
        time.sleep(0.001)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)


def _refuse_unless_regular(fd: int, path: str) -> None:
    """Close `fd` and raise if it is not a regular file: a FIFO or device at a lock path is no lock file."""
    try:
        mode = os.fstat(fd).st_mode
    except OSError as error:
        os.close(fd)
        raise StorageError(f"cannot check the writer lock: {error.strerror or error}", path=path) from None
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise StorageError("the writer lock is not a regular file; remove it if no writer is running", path=path)


def _open_error(error: OSError, action: str, path: str) -> StorageError:
    if error.errno == errno.ELOOP:  # O_NOFOLLOW met a symlink
        return StorageError(f"{action}: it is a symbolic link; remove it if no writer is running", path=path)
    return StorageError(f"{action}: {error.strerror or error}", path=path)


_HELD: "weakref.WeakSet[WriterLock]" = weakref.WeakSet()


def _close_inherited_locks() -> None:
    """In a forked child: close the inherited lock descriptors, so that the lock dies with the process that
    took it (a long-lived child must not keep a dead writer's lock) and the child cannot release it."""
    for lock in list(_HELD):
        if lock._fd >= 0:
            try:
                os.close(lock._fd)
            except OSError:
                pass
            lock._fd = -1
    _HELD.clear()


os.register_at_fork(after_in_child=_close_inherited_locks)


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

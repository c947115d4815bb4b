"""One cache of downloaded objects per node: each object is downloaded once per machine, verified, and
evicted least-recently-used under a byte limit.

Every process on a node (DataLoader workers, ranks) opens a `NodeCache` on the same directory; they
coordinate only through files there. A download holds an exclusive flock on the object's lock file
(`varstore.local.locks.WriterLock`: the kernel releases it when the holder dies, SIGKILL included), writes
to a temporary name, checks the expected size and CRC32C, fsyncs and renames. So a final name only ever
holds verified bytes, and a crash leaves at most a temporary file, removed by the next fetch of that
object or the next eviction once no live downloader holds its lock.

Eviction unlinks final files oldest mtime first (a fetch that finds its object refreshes the mtime; an
mtime later than now, from a clock stepped back or a `cp -p`, is set to now so that the file ages like the
rest). It runs with the cache-wide lock held, and every publish under a limit first evicts, with that lock
held, until the other final files and the new one fit. Hits add no bytes, so while all processes use the
same limit the final files never total more than it, except that one object larger than the limit is kept
alone (temporaries of downloads in progress are not counted). A download in progress is never touched: it
has no final name until it is published. A process that has a file open or
mapped keeps reading it: the inode lives until its last reference goes. A path `fetch` returned can still
be evicted before the caller opens it when the limit is smaller than what the node's processes use at
once: open it at once, and fetch again if it is gone; or use `open`, which returns a descriptor opened before
anything can evict the file (a download's is opened before it is published).

The cache's locks do not record their holder (a `WriterLock` writes its pid): on a full disk that write
fails, and eviction must still run there to free space.

The cache is per user. It trusts its directory, which is why a new one is created mode 0o700: a file of
the right size under an object's name is served. A directory shared between users is not supported: a
fetch that finds another user's file under an object's name raises `StorageError` saying so. Anything
that is not a regular file where the cache keeps lock or temporary files (a FIFO, a symlink, a directory)
is removed by the next eviction or fetch of that object; one at the cache-wide lock path means a broken cache directory and is
refused with an error naming it.

The cache knows nothing about URLs: a key is any string, and the caller passes the function that
downloads it. An object's file name hashes its key, its size, its CRC32C and its `identity`: whatever else the
caller knows that tells this content from other bytes under the same key (the remote readers pass the
dataset's version and the shard's manifest entry; a shard opened alone, the store's ETags and its index
header), because a size and a CRC32C alone do not (two index files that differ only in their header have the
same size and CRC32C: a header ends with the CRC32C of its first 60 bytes, and the CRC32C of any message
followed by its own CRC32C is a constant).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import mmap
import operator
import os
import re
import shutil
import stat
import time
from typing import Callable

from ..errors import ConcurrentWriterError, StorageError, VarstoreError
from ..format.checksum import crc32c_of_range
from ..local.locks import LOCK_SUFFIX, WriterLock, directory_lock_path, lock_waiting
from ..local.publish import TEMP_MARK, make_directories, publish, storage_error, temporary_path

_DIGEST_HEX_DIGITS = 32
_READABLE_TAIL_CHARACTERS = 40
# A final object's name; the readable tail has no '.', so no key can produce a name that looks like a
# lock file or a temporary one.
_OBJECT_NAME = re.compile(r"[0-9a-f]{32}(-[A-Za-z0-9_-]+)?")


def default_cache_dir() -> str:
    """`$VARSTORE_CACHE_DIR`, else `$XDG_CACHE_HOME/varstore`, else `~/.cache/varstore` (an empty or, for XDG,
    relative value counts as unset, as the XDG base directory specification says)."""
    chosen = os.environ.get("VARSTORE_CACHE_DIR")
    if chosen:
        return os.path.abspath(chosen)
    xdg_cache = os.environ.get("XDG_CACHE_HOME", "")
    base = xdg_cache if os.path.isabs(xdg_cache) else os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "varstore")


class DamagedDownloadError(StorageError):
    """A download that arrived, but not as the bytes expected (another size, another CRC32C): perhaps damaged on
    the way, so worth fetching again; nothing was cached."""


def object_name(key: str, size: int, crc32c: int, identity: str = "") -> str:
    """The file name of object `key` of `size` bytes with CRC32C `crc32c` and `identity` (see the module's
    docstring): a hash of all four, so that no key names a path outside the cache and an object replaced under
    the same key (a rewritten dataset) is a new file, never the old one; then the key's last component reduced
    to letters, digits, '_' and '-' for people reading the directory."""
    named = f"{key}\0{size}\0{crc32c}" + (f"\0{identity}" if identity else "")
    digest = hashlib.sha256(named.encode("utf-8", "surrogatepass")).hexdigest()[:_DIGEST_HEX_DIGITS]
    tail = re.sub(r"[^A-Za-z0-9_-]", "_", key.rstrip("/").rsplit("/", 1)[-1])[-_READABLE_TAIL_CHARACTERS:]
    return f"{digest}-{tail}" if tail else digest


class NodeCache:
    """The objects cached in `directory`, at most `limit_bytes` of them in total (no limit if None).

    One object larger than the limit alone is still cached (the caller needs it): every other object is
    evicted for it, and it is the first to go when anything else is fetched.
    """

    def __init__(self, directory: str, *, limit_bytes: int | None = None) -> None:
        if limit_bytes is not None and limit_bytes < 0:
            raise VarstoreError(f"the cache limit must be at least 0 bytes, not {limit_bytes}", path=directory)
        self.directory = os.path.abspath(directory)
        self.limit_bytes = limit_bytes
        _make_private_directory(self.directory)

    def fetch(self, key: str, size: int, crc32c: int, download: Callable[[str], None], *, identity: str = "") -> str:
        """The local path of object `key`, which must be `size` bytes with CRC32C `crc32c`; `identity` is what
        else tells its content apart (the module's docstring): objects differing in any of the four are
        different files.

        If no process on this node has it yet, `download(temporary_path)` writes it (once per node: others
        fetching it meanwhile wait, then use it). A download that is not exactly `size` bytes (shorter or
        longer) with that CRC32C raises `DamagedDownloadError`, one that fails with an `OSError` (a full disk)
        `StorageError`, each naming the key; neither caches anything. A cached file is trusted if its size is
        right: its CRC was checked when it arrived, and readers check their records' own checksums.
        """
        size, crc32c = _checked_expectations(key, size, crc32c, identity)
        final = os.path.join(self.directory, object_name(key, size, crc32c, identity))
        if _use_if_cached(final, size):
            return final
        with self._lock_object(final, key):
            if _use_if_cached(final, size):
                return final  # another process downloaded it while this one waited
            os.close(self._download_and_publish(final, key, size, crc32c, download))
        return final

    def open(self, key: str, size: int, crc32c: int, download: Callable[[str], None], *, identity: str = "") -> int:
        """A read-only descriptor of object `key`'s file, as `fetch` would give its path, but opened before any
        eviction can unlink it (a download's before it is published): the caller reads it however small the
        limit and however many processes share the cache. The caller closes it."""
        size, crc32c = _checked_expectations(key, size, crc32c, identity)
        final = os.path.join(self.directory, object_name(key, size, crc32c, identity))
        fd = _open_if_cached(final, size)
        if fd is not None:
            return fd
        with self._lock_object(final, key):
            fd = _open_if_cached(final, size)
            if fd is not None:
                return fd  # another process downloaded it while this one waited
            return self._download_and_publish(final, key, size, crc32c, download)

    def _download_and_publish(self, final: str, key: str, size: int, crc32c: int, download: Callable[[str], None]) -> int:
        """With the object's lock held: download it, verify it, publish it; a descriptor of it, opened before it
        was published."""
        for stale in [final, *self._temporaries_of(final)]:  # a wrong-sized file, dead downloads
            _remove_entry(stale)
        if self.limit_bytes is not None:
            # Room for what fits the limit; an object larger than it (or a size a forged manifest gave, 2**62)
            # has every other object evicted only at its publish, once it arrived as expected.
            self.evict(size if size <= self.limit_bytes else 0)
        temporary = temporary_path(final)
        fd = -1
        try:
            _download(download, temporary, key)
            fd = _verify_and_sync(temporary, key, size, crc32c)
            self._publish(temporary, final, size)
        except BaseException:
            if fd >= 0:
                os.close(fd)
            _remove_entry(temporary)
            raise
        return fd

    def cached(self, key: str, size: int, crc32c: int, *, identity: str = "") -> str | None:
        """The local path of object `key` (as `fetch` names it) if this node has it already (marked used now),
        else None; never downloads. Open it at once: it may be evicted later, never while open."""
        size, crc32c = _checked_expectations(key, size, crc32c, identity)
        final = os.path.join(self.directory, object_name(key, size, crc32c, identity))
        return final if _use_if_cached(final, size) else None

    def evict(self, needed_bytes: int = 0) -> list[str]:
        """Unlink least-recently-used objects until the rest and `needed_bytes` fit the limit (or none is
        left), and remove the temporaries of dead downloads. Returns the paths it removed."""
        with self._lock_cache():
            return self._evict_holding_cache_lock(needed_bytes)

    def _lock_object(self, final: str, key: str) -> WriterLock:
        """The lock of the object whose final path is `final`, waiting for another holder. Anything but a
        regular file at its path is removed first, with the cache lock held (see `_remove_dead_downloads`)."""
        path = final + LOCK_SUFFIX
        if _is_planted(path):
            with self._lock_cache():
                _remove_unless_regular(path)
        return lock_waiting(path, f"cached object {key}", record_holder=False)

    def _lock_cache(self) -> WriterLock:
        """The cache-wide lock, held by eviction and publishing; waits for another holder."""
        path = directory_lock_path(self.directory)
        if _is_planted(path):
            raise StorageError(
                "is not a lock file (a FIFO, symbolic link or directory): the cache directory is broken; "
                "remove it (no varstore process needs it)",
                path=path,
            )
        return lock_waiting(path, f"cache {self.directory}", record_holder=False)

    def _publish(self, temporary: str, final: str, size: int) -> None:
        """Name the verified download, dated now; under a limit, first evict for it with the cache locked, so
        that downloads finishing together cannot overshoot the limit."""
        _mark_used(temporary)
        try:
            if self.limit_bytes is None:
                publish([(temporary, final)], overwrite=True)
                return
            with self._lock_cache():
                self._evict_holding_cache_lock(size)
                publish([(temporary, final)], overwrite=True)
        except OSError as error:
            raise storage_error(error, "naming a downloaded object") from None

    def _evict_holding_cache_lock(self, needed_bytes: int) -> list[str]:
        """Final files appear only by publishing, which holds the cache lock as this does, so none appears
        meanwhile: once the total fits, it stays within the limit until this returns. No object lock is
        taken: an object's lock is held while it is downloaded, when it has no final file."""
        removed = self._remove_dead_downloads()
        if self.limit_bytes is None:
            return removed
        objects = sorted(self._objects())
        total = sum(size for _, _, size in objects)
        for _, name, size in objects:
            if total + needed_bytes <= self.limit_bytes:
                break
            path = os.path.join(self.directory, name)
            try:
                os.unlink(path)
                removed.append(path)
            except FileNotFoundError:
                pass  # a fetch removed it (it had the wrong size)
            except PermissionError:
                raise _shared_cache_error(path) from None  # another user's file in a sticky directory
            except OSError as error:
                raise storage_error(error, "evicting a cached object") from None
            total -= size
        return removed

    def _objects(self) -> list[tuple[int, str, int]]:
        """(mtime_ns, name, size) of each final object file; an mtime later than now is set to now."""
        found = []
        now = time.time_ns()
        for name in self._names():
            if _OBJECT_NAME.fullmatch(name):
                path = os.path.join(self.directory, name)
                try:
                    status = os.lstat(path)
                except FileNotFoundError:
                    continue
                if not stat.S_ISREG(status.st_mode):
                    continue
                if status.st_mtime_ns > now:
                    with contextlib.suppress(StorageError):
                        _mark_used(path)
                found.append((min(status.st_mtime_ns, now), name, status.st_size))
        return found

    def _remove_dead_downloads(self) -> list[str]:
        """Remove the temporaries and lock files of objects whose lock no process holds: their downloader died
        (taking the lock and releasing it unlinks the lock file). Anything but a regular file at a lock path
        is removed first: with the cache lock held no other process removes it, so no fetch can be creating
        a real lock file there meanwhile."""
        removed: list[str] = []
        names = self._names()
        finals = {name.split(TEMP_MARK)[0] for name in names if TEMP_MARK in name}
        finals.update(name[: -len(LOCK_SUFFIX)] for name in names if name.endswith(LOCK_SUFFIX))
        for final in sorted(name for name in finals if _OBJECT_NAME.fullmatch(name)):
            final_path = os.path.join(self.directory, final)
            _remove_unless_regular(final_path + LOCK_SUFFIX)
            try:
                lock = WriterLock(final_path + LOCK_SUFFIX, f"cached object {final}", record_holder=False)
            except ConcurrentWriterError:
                continue  # a live download
            except StorageError:
                continue  # junk that could not be removed: leave this object's temporaries to a later eviction
            with lock:
                removed.extend(path for path in self._temporaries_of(final_path) if _remove_entry(path))
        return removed

    def _temporaries_of(self, final: str) -> list[str]:
        prefix = os.path.basename(final) + TEMP_MARK
        return [os.path.join(self.directory, name) for name in self._names() if name.startswith(prefix)]

    def _names(self) -> list[str]:
        try:
            return os.listdir(self.directory)
        except OSError as error:
            raise storage_error(error, "listing the cache") from None


def _checked_expectations(key: str, size: int, crc32c: int, identity: str = "") -> tuple[int, int]:
    """`size` and `crc32c` as ints, or `VarstoreError` naming `key` unless they are a byte count and a CRC32C
    (and the key and identity strings)."""
    if not isinstance(key, str):
        raise VarstoreError(f"a cache key is a string, not {type(key).__name__}")
    if not isinstance(identity, str):
        raise VarstoreError(f"a cache identity is a string, not {type(identity).__name__}", path=key)
    checked_size, checked_crc = _integer_or_none(size), _integer_or_none(crc32c)
    if checked_size is None or checked_size < 0:
        raise VarstoreError(f"the expected size must be an int of at least 0 bytes, not {size!r}", path=key)
    if checked_crc is None or not 0 <= checked_crc < 2**32:
        raise VarstoreError(f"the expected CRC32C must be an int from 0 to 2**32 - 1, not {crc32c!r}", path=key)
    return checked_size, checked_crc


def _integer_or_none(value: object) -> int | None:
    """`value` as an int if it is an integer (numpy's included) other than a bool."""
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        return None


def _use_if_cached(final: str, size: int) -> bool:
    """Whether `final` is a regular file of `size` bytes; if so, mark it used now (LRU order is mtime order).
    Another user's file there is refused: the cache is per user."""
    try:
        status = os.lstat(final)
    except FileNotFoundError:
        return False
    except OSError as error:
        raise storage_error(error, "looking up a cached object") from None
    if status.st_uid != os.geteuid():
        raise _shared_cache_error(final)
    return stat.S_ISREG(status.st_mode) and status.st_size == size and _mark_used(final)


def _open_if_cached(final: str, size: int) -> int | None:
    """A read-only descriptor of `final` if it is a cached object of `size` bytes (marked used now), else None."""
    if not _use_if_cached(final, size):
        return None
    try:
        fd = os.open(final, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except (FileNotFoundError, OSError) as error:
        if isinstance(error, FileNotFoundError) or error.errno == errno.ELOOP:
            return None  # evicted (or replaced by a link) since it was looked up: download it
        raise storage_error(error, "opening a cached object") from None
    status = os.fstat(fd)
    if stat.S_ISREG(status.st_mode) and status.st_size == size:
        return fd
    os.close(fd)
    return None


def _shared_cache_error(path: str) -> StorageError:
    return StorageError(
        f"this cached object belongs to another user, not to uid {os.geteuid()}: a cache directory shared "
        "between users is not supported; give each user their own (VARSTORE_CACHE_DIR)",
        path=path,
    )


def _download(download: Callable[[str], None], temporary: str, key: str) -> None:
    try:
        download(temporary)
    except VarstoreError:
        raise  # the download's own verdict (a missing object is a MissingFileError, an OSError too)
    except OSError as error:  # writing the temporary file failed (a full disk)
        raise StorageError(f"downloading failed: {error.strerror or error}; nothing was cached", path=key) from None


def _remove_entry(path: str) -> bool:
    """Remove whatever `path` names (a directory with its contents; a symlink, not its target); whether it
    removed something. Never raises."""
    try:
        if stat.S_ISDIR(os.lstat(path).st_mode):
            shutil.rmtree(path)
        else:
            os.unlink(path)
    except OSError:
        return False
    return True


def _is_planted(path: str) -> bool:
    """Whether something other than a regular file (a FIFO, symlink, directory) is at the lock path `path`."""
    try:
        return not stat.S_ISREG(os.lstat(path).st_mode)
    except FileNotFoundError:
        return False
    except OSError as error:
        raise storage_error(error, "checking a lock file of the cache") from None


def _remove_unless_regular(path: str) -> None:
    if _is_planted(path):
        _remove_entry(path)


def _mark_used(path: str) -> bool:
    """Set the mtime of `path` to now (the clock, not the kernel's coarse file time, so that fetches a few
    milliseconds apart stay ordered); False if the file is gone."""
    now = time.time_ns()
    try:
        os.utime(path, ns=(now, now), follow_symlinks=False)
    except FileNotFoundError:
        return False
    except OSError as error:
        raise storage_error(error, "marking a cached object used") from None
    return True


def _verify_and_sync(temporary: str, key: str, size: int, crc32c: int) -> int:
    """Raise `DamagedDownloadError` naming `key` unless the download at `temporary` is exactly `size` bytes with
    CRC32C `crc32c`; then fsync it, so that its final name never holds anything but these bytes. Returns the
    descriptor (read-only) it checked, for the caller to close."""
    try:
        fd = os.open(temporary, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        raise StorageError(f"the download of {key} wrote no file; nothing was cached", path=temporary) from None
    except OSError as error:
        raise storage_error(error, f"opening the download of {key}") from None
    try:
        status = os.fstat(fd)
        if not stat.S_ISREG(status.st_mode):
            raise StorageError(f"the download of {key} left something that is not a regular file; nothing was cached",
                               path=temporary)
        actual_size = status.st_size
        if actual_size != size:  # longer as well as shorter: the right bytes followed by junk are not the object
            raise DamagedDownloadError(
                f"downloaded {actual_size} bytes; expected {size} bytes with CRC32C {crc32c:#010x}; nothing was cached",
                path=key,
            )
        actual_crc = _crc32c_of_file(fd, size)
        if actual_crc != crc32c:
            raise DamagedDownloadError(
                f"downloaded {size} bytes with CRC32C {actual_crc:#010x}; expected CRC32C {crc32c:#010x}; "
                "nothing was cached",
                path=key,
            )
        os.fsync(fd)
    except OSError as error:
        os.close(fd)
        raise storage_error(error, f"verifying the download of {key}") from None
    except BaseException:
        os.close(fd)
        raise
    return fd


def _crc32c_of_file(fd: int, size: int) -> int:
    if size == 0:
        return crc32c_of_range(b"", 0, 0)
    with mmap.mmap(fd, size, access=mmap.ACCESS_READ) as mapped:
        return crc32c_of_range(mapped, 0, size)


def _make_private_directory(directory: str) -> None:
    """Create the cache directory readable by its user only (mode 0o700): it holds copies of objects that
    credentials protect. An existing directory keeps its mode: its owner chose it."""
    if os.path.isdir(directory):
        return
    try:
        make_directories(os.path.dirname(directory))
        os.mkdir(directory, 0o700)
    except FileExistsError:
        pass
    except OSError as error:
        raise storage_error(error, "creating the cache directory") from None

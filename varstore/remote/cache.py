"""One cache of downloaded objects per node: each object is downloaded once per machine, verified, and
evicted least-recently-used under a byte limit.

Every process on a node (DataLoader workers, ranks) opens a `NodeCache` on the same directory; they
coordinate only through files there. A download holds an exclusive flock on the object's lock file
(`varstore.locking.WriterLock`: the kernel releases it when the holder dies, SIGKILL included), writes
to a temporary name, checks the expected size and CRC32C, fsyncs and renames. So a final name only ever
holds verified bytes, and a crash leaves at most a temporary file, removed by the next fetch of that
object or the next eviction once no live downloader holds its lock.

Eviction unlinks final files oldest mtime first (a fetch that finds its object refreshes the mtime),
never one whose lock is held. A process that has the file open or mapped keeps reading it: the inode
lives until its last reference goes. A path `fetch` returned can still be evicted before the caller opens
it when the limit is smaller than what the node's processes use at once: open it at once, and fetch again
if it is gone.

The cache knows nothing about URLs: a key is any string, and the caller passes the function that
downloads it.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import re
import stat
import time
from typing import Callable

from ..checksum import crc32c_of_range
from ..errors import ConcurrentWriterError, StorageError, VarstoreError
from ..locking import LOCK_SUFFIX, WriterLock, directory_lock_path, lock_waiting
from ..storage import TEMP_MARK, make_directories, publish, remove_quietly, storage_error, temporary_path

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


def object_name(key: str, size: int, crc32c: int) -> str:
    """The file name of object `key` of `size` bytes with CRC32C `crc32c`: a hash of all three, so that no
    key names a path outside the cache and an object replaced under the same key (a rewritten dataset) is a
    new file, never the old one; then the key's last component reduced to letters, digits, '_' and '-' for
    people reading the directory."""
    identity = f"{key}\0{size}\0{crc32c}".encode("utf-8", "surrogatepass")
    digest = hashlib.sha256(identity).hexdigest()[:_DIGEST_HEX_DIGITS]
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

    def fetch(self, key: str, size: int, crc32c: int, download: Callable[[str], None]) -> str:
        """The local path of object `key`, which must be `size` bytes with CRC32C `crc32c`.

        If no process on this node has it yet, `download(temporary_path)` writes it (once per node: others
        fetching it meanwhile wait, then use it). A download that is not `size` bytes with that CRC32C
        raises `StorageError` and caches nothing. A cached file is trusted if its size is right: its CRC
        was checked when it arrived, and readers check their records' own checksums.
        """
        final = os.path.join(self.directory, object_name(key, size, crc32c))
        if _use_if_cached(final, size):
            return final
        with lock_waiting(final + LOCK_SUFFIX, f"cached object {key}"):
            if _use_if_cached(final, size):
                return final  # another process downloaded it while this one waited
            remove_quietly([final, *self._temporaries_of(final)])  # a wrong-sized file, dead downloads
            if self.limit_bytes is not None:
                self.evict(size)
            temporary = temporary_path(final)
            try:
                download(temporary)
                _verify_and_sync(temporary, key, size, crc32c)
                self._publish(temporary, final, size)
            except BaseException:
                remove_quietly([temporary])
                raise
        return final

    def evict(self, needed_bytes: int = 0) -> list[str]:
        """Unlink least-recently-used objects until the rest and `needed_bytes` fit the limit, skipping any
        whose lock a fetch holds, and remove the temporaries of dead downloads. Returns the removed paths."""
        with lock_waiting(directory_lock_path(self.directory), f"cache {self.directory}"):
            return self._evict_holding_cache_lock(needed_bytes)

    def _publish(self, temporary: str, final: str, size: int) -> None:
        """Name the verified download, dated now; under a limit, first evict for it with the cache locked, so
        that downloads finishing together cannot overshoot the limit."""
        _mark_used(temporary)
        try:
            if self.limit_bytes is None:
                publish([(temporary, final)], overwrite=True)
                return
            with lock_waiting(directory_lock_path(self.directory), f"cache {self.directory}"):
                self._evict_holding_cache_lock(size)
                publish([(temporary, final)], overwrite=True)
        except OSError as error:
            raise storage_error(error, "naming a downloaded object") from None

    def _evict_holding_cache_lock(self, needed_bytes: int) -> list[str]:
        removed = self._remove_dead_downloads()
        if self.limit_bytes is None:
            return removed
        objects = sorted(self._objects())
        total = sum(size for _, _, size, _ in objects)
        for mtime_ns, name, size, inode in objects:
            if total + needed_bytes <= self.limit_bytes:
                break
            path = os.path.join(self.directory, name)
            if _remove_unless_in_use(path, inode, mtime_ns):
                total -= size
                removed.append(path)
        return removed

    def _objects(self) -> list[tuple[int, str, int, int]]:
        """(mtime_ns, name, size, inode) of each final object file."""
        found = []
        for name in self._names():
            if _OBJECT_NAME.fullmatch(name):
                try:
                    status = os.lstat(os.path.join(self.directory, name))
                except FileNotFoundError:
                    continue
                if stat.S_ISREG(status.st_mode):
                    found.append((status.st_mtime_ns, name, status.st_size, status.st_ino))
        return found

    def _remove_dead_downloads(self) -> list[str]:
        """Remove the temporary files and lock files of objects whose lock no process holds: their downloader
        died (taking the lock and releasing it unlinks the lock file)."""
        removed: list[str] = []
        names = self._names()
        finals = {name.split(TEMP_MARK)[0] for name in names if TEMP_MARK in name}
        finals.update(name[: -len(LOCK_SUFFIX)] for name in names if name.endswith(LOCK_SUFFIX))
        for final in sorted(name for name in finals if _OBJECT_NAME.fullmatch(name)):
            final_path = os.path.join(self.directory, final)
            try:
                lock = WriterLock(final_path + LOCK_SUFFIX, f"cached object {final}")
            except ConcurrentWriterError:
                continue  # a live download
            with lock:
                temporaries = self._temporaries_of(final_path)
                remove_quietly(temporaries)
            removed.extend(temporaries)
        return removed

    def _temporaries_of(self, final: str) -> list[str]:
        prefix = os.path.basename(final) + TEMP_MARK
        return [os.path.join(self.directory, name) for name in self._names() if name.startswith(prefix)]

    def _names(self) -> list[str]:
        try:
            return os.listdir(self.directory)
        except OSError as error:
            raise storage_error(error, "listing the cache") from None


def _use_if_cached(final: str, size: int) -> bool:
    """Whether `final` is a regular file of `size` bytes; if so, mark it used now (LRU order is mtime order)."""
    try:
        status = os.lstat(final)
    except FileNotFoundError:
        return False
    except OSError as error:
        raise storage_error(error, "looking up a cached object") from None
    return stat.S_ISREG(status.st_mode) and status.st_size == size and _mark_used(final)


def _mark_used(path: str) -> bool:
    """Set the mtime of `path` to now (the clock, not the kernel's coarse file time, so that fetches a few
    milliseconds apart stay ordered); False if the file is gone."""
    now = time.time_ns()
    try:
        os.utime(path, ns=(now, now), follow_symlinks=False)
    except FileNotFoundError:
        return False
    except PermissionError:
        pass  # another user's file in a shared cache: it stays where it is in the LRU order
    except OSError as error:
        raise storage_error(error, "marking a cached object used") from None
    return True


def _remove_unless_in_use(path: str, inode: int, mtime_ns: int) -> bool:
    """Unlink the object at `path` unless a fetch holds its lock or used it since it was listed."""
    try:
        lock = WriterLock(path + LOCK_SUFFIX, f"cached object {os.path.basename(path)}")
    except ConcurrentWriterError:
        return False
    with lock:
        try:
            status = os.lstat(path)
        except FileNotFoundError:
            return False
        if (status.st_ino, status.st_mtime_ns) != (inode, mtime_ns):
            return False
        try:
            os.unlink(path)
        except OSError as error:
            raise storage_error(error, "evicting a cached object") from None
    return True


def _verify_and_sync(temporary: str, key: str, size: int, crc32c: int) -> None:
    """Raise `StorageError` naming `key` unless the download at `temporary` is `size` bytes with CRC32C
    `crc32c`; then fsync it, so that its final name never holds anything but these bytes."""
    try:
        fd = os.open(temporary, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        raise StorageError(f"the download of {key} wrote no file; nothing was cached", path=temporary) from None
    except OSError as error:
        raise storage_error(error, f"opening the download of {key}") from None
    try:
        actual_size = os.fstat(fd).st_size
        if actual_size != size:
            raise StorageError(
                f"downloaded {actual_size} bytes; expected {size} bytes with CRC32C {crc32c:#010x}; nothing was cached",
                path=key,
            )
        actual_crc = _crc32c_of_file(fd, size)
        if actual_crc != crc32c:
            raise StorageError(
                f"downloaded {size} bytes with CRC32C {actual_crc:#010x}; expected CRC32C {crc32c:#010x}; "
                "nothing was cached",
                path=key,
            )
        os.fsync(fd)
    except OSError as error:
        raise storage_error(error, f"verifying the download of {key}") from None
    finally:
        os.close(fd)


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

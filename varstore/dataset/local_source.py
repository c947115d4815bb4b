"""A dataset directory on a local or mounted filesystem as a `ShardedReader` source, and the checks of §3.1 that
a listed shard passes there: its files' sizes and index header at open (one 64-byte read per shard; a shard of 0
records is opened whole), its whole entry when it is mapped, and its index checksum in a full verification.
"""

from __future__ import annotations

import errno
import os
import stat
from typing import Callable

from ..errors import FormatError, MissingFileError, StorageError, VarstoreError
from ..format import header as fmt
from ..format.checksum import crc32c_of_range
from ..format.codecs import Codec
from ..format.manifest import SHARD_FILE_NOT_REGULAR, Manifest, ShardEntry, check_header_against_entry
from ..local.manifest_file import read_manifest
from ..shard.reader import Reader

# What opening a missing, damaged or replaced shard raises; a StorageError (EMFILE, EIO) is no verdict on the shard.
_SHARD_ERRORS = (FormatError, MissingFileError)


def _check_shard_file(path: str, expected_size: int) -> None:
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        raise MissingFileError("shard file listed in the manifest is missing", path=path) from None
    except OSError as error:
        raise StorageError(f"cannot stat the shard file: {error.strerror or error}", path=path) from None
    if not stat.S_ISREG(info.st_mode):
        raise FormatError(SHARD_FILE_NOT_REGULAR, path=path)
    if info.st_size != expected_size:
        raise FormatError(f"shard file is {info.st_size} bytes, the manifest says {expected_size}", path=path)


def check_listed_shard(directory: str, entry: ShardEntry, codec: Codec) -> None:
    """Check a listed shard against its manifest `entry` (§3.1): the data file's size, and the index file's size
    and header, read with one 64-byte pread and checked as §1.3 steps 1-6 say, against the entry. A shard of 0
    records is also opened, so all of §1.3 and its codec are checked now: no read ever would."""
    data_path, index_path = fmt.shard_paths(os.path.join(directory, entry.name))
    _check_shard_file(data_path, entry.data_size)
    check_header_against_entry(_read_listed_header(index_path, entry.index_size), entry, codec, index_path)
    if entry.records == 0:
        open_listed_shard(directory, entry, codec).close()


def _read_listed_header(index_path: str, expected_size: int) -> fmt.Header:
    """The header of the index file at `index_path`, a regular file (not a link) of `expected_size` bytes."""
    try:
        fd = os.open(index_path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)  # a planted FIFO must not block
    except FileNotFoundError:
        raise MissingFileError("shard file listed in the manifest is missing", path=index_path) from None
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise FormatError(SHARD_FILE_NOT_REGULAR, path=index_path) from None
        raise StorageError(f"cannot open the shard file: {error.strerror or error}", path=index_path) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise FormatError(SHARD_FILE_NOT_REGULAR, path=index_path)
        if info.st_size != expected_size:
            raise FormatError(f"shard file is {info.st_size} bytes, the manifest says {expected_size}", path=index_path)
        head = os.pread(fd, fmt.HEADER_SIZE, 0)
    except OSError as error:
        raise StorageError(f"cannot read the shard file: {error.strerror or error}", path=index_path) from None
    finally:
        os.close(fd)
    return fmt.unpack_header(head, index_size=expected_size, path=index_path)


def open_listed_shard(directory: str, entry: ShardEntry, codec: Codec, *, verify_reads: bool = False) -> Reader:
    """Open the shard a manifest `entry` names, checking its files and header against the whole entry and the codec.

    The index checksum is checked without reading the index: the header records
    the CRC of the bytes after it, which combined with the header's own CRC gives
    the file's (the body itself is checked by `verify`).
    """
    prefix = os.path.join(directory, entry.name)
    for path, size in zip(fmt.shard_paths(prefix), (entry.data_size, entry.index_size)):
        _check_shard_file(path, size)
    reader = Reader(prefix, verify_reads=verify_reads)
    reader.check_against_entry(entry, codec)
    return reader


def verify_listed_shard(reader: Reader, entry: ShardEntry, progress: Callable[[int], None] | None = None) -> None:
    """Check a shard's index file against the checksum its manifest `entry` records, then every byte (`Reader.verify`)."""
    index_crc = crc32c_of_range(reader._index_map, 0, entry.index_size)
    if index_crc != entry.index_crc32c:
        raise FormatError(
            f"index file checksum is {index_crc:#010x}, the manifest says {entry.index_crc32c:#010x}",
            path=reader.index_path,
        )
    reader.verify(progress)


class LocalDatasetSource:
    """A dataset directory on a local or mounted filesystem, as `ShardedReader` reads it."""

    is_remote = False

    def __init__(self, directory: str) -> None:
        self.directory = os.path.abspath(directory)

    stamp = None  # a local manifest is read again, not cached: see `RemoteDatasetSource.open_manifest`

    def read_manifest(self) -> Manifest:
        return read_manifest(self.directory)

    def open_manifest(self, stamp: object) -> Manifest:
        """The manifest as it is now (a reopened reader then checks it is the version it pinned)."""
        return read_manifest(self.directory)

    def check_listed(self, manifest: Manifest, codec: Codec) -> dict[int, VarstoreError]:
        """The listed shards that fail `check_listed_shard`, by position."""
        damaged: dict[int, VarstoreError] = {}
        for position, entry in enumerate(manifest.shards):
            try:
                check_listed_shard(self.directory, entry, codec)
            except _SHARD_ERRORS as error:
                damaged[position] = error
        return damaged

    def open_shard(
        self, manifest: Manifest, entry: ShardEntry, codec: Codec, *, verify_reads: bool, replaced_check: Callable[[], None], whole: bool
    ) -> Reader:
        return open_listed_shard(self.directory, entry, codec, verify_reads=verify_reads)

    @staticmethod
    def fetch_shard(shard: Reader) -> None:
        """Nothing: a local shard's files are here."""

    @staticmethod
    def fits_in_cache(manifest: Manifest) -> bool:
        """Always: a local dataset needs no cache."""
        return True

    @staticmethod
    def state() -> None:
        return None

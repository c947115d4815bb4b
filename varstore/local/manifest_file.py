"""A dataset directory's ``manifest.json`` on a local or mounted filesystem: read it (a regular file, never a
link or a FIFO), commit it atomically (temporary file, fsync, then its name), and describe a committed shard's
files as the manifest entry that lists it.
"""

from __future__ import annotations

import errno
import os
import stat
from typing import Any

from ..errors import FormatError, MissingFileError, ShardExistsError, StorageError
from ..format import header as fmt
from ..format.checksum import crc32c
from ..format.manifest import (
    MANIFEST_NAME,
    MAX_MANIFEST_SIZE,
    SHARD_FILE_NOT_REGULAR,
    Manifest,
    ShardEntry,
    checked_manifest_bytes,
    decode_manifest,
)
from ..format.metadata import decode_metadata
from .publish import publish_new, remove_quietly, storage_error, temporary_path, write_all


def read_manifest(directory: str) -> Manifest:
    path = os.path.join(directory, MANIFEST_NAME)
    try:
        # A FIFO planted here must not block the open; a symbolic link is not followed (§3).
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    except FileNotFoundError:
        raise MissingFileError(f"no {MANIFEST_NAME}: not a varstore dataset, or its writer did not finish", path=directory) from None
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise FormatError("manifest is a symbolic link; it must be a regular file", path=path) from None
        raise storage_error(error, "opening the manifest") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise FormatError("manifest is not a regular file", path=path)
        if info.st_size > MAX_MANIFEST_SIZE:
            raise FormatError(f"manifest is {info.st_size} bytes, over the limit of {MAX_MANIFEST_SIZE}", path=path)
        raw = os.pread(fd, info.st_size, 0)
    except OSError as error:
        raise storage_error(error, "reading the manifest") from None
    finally:
        os.close(fd)
    return decode_manifest(raw, path=path)


def commit_manifest_file(directory: str, manifest: Manifest, *, overwrite: bool = False) -> None:
    """Check `manifest` as a reader would (`checked_manifest_bytes`), then commit it with `commit_manifest_bytes`."""
    final = os.path.join(directory, MANIFEST_NAME)
    commit_manifest_bytes(directory, checked_manifest_bytes(manifest, path=final), overwrite=overwrite)


def commit_manifest_bytes(directory: str, raw: bytes, *, overwrite: bool = False) -> None:
    """Commit the checked manifest bytes `raw` atomically: temporary file, fsync, then its final name ``manifest.json``.

    Naming it is the commit point: a failure before leaves the previous manifest
    untouched. Without `overwrite` an existing manifest is never replaced
    (`ShardExistsError`); with it, the new one is renamed over the old one, so
    readers always find one. The caller then makes the commit durable with `sync_directory`.
    """
    final = os.path.join(directory, MANIFEST_NAME)
    temporary = temporary_path(final)
    try:
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            write_all(fd, raw)
            os.fsync(fd)
        finally:
            os.close(fd)
        if overwrite:
            os.replace(temporary, final)
        else:
            publish_new([(temporary, final)])
    except ShardExistsError:
        remove_quietly([temporary])
        raise ShardExistsError("a dataset was committed here meanwhile; pass overwrite=True to replace it", path=final) from None
    except OSError as error:
        remove_quietly([temporary])
        raise storage_error(error, "writing the manifest") from None


def describe_shard(directory: str, name: str) -> tuple[ShardEntry, fmt.Header, dict[str, Any]]:
    """Read a committed shard's header and metadata and checksum its index file, for a manifest entry.

    Its files must be regular files, not symbolic links, as a reader requires (§3.1): a writer that followed a link
    would list a shard every reader then refuses.
    """
    data_path, index_path = fmt.shard_paths(os.path.join(directory, name))
    try:
        # Not following a link; a FIFO planted here must not block the open.
        with open(os.open(index_path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW), "rb") as file:
            info = os.fstat(file.fileno())
            if not stat.S_ISREG(info.st_mode):
                raise FormatError(SHARD_FILE_NOT_REGULAR, path=index_path)
            index_size = info.st_size
            head = file.read(fmt.HEADER_SIZE)
            header = fmt.unpack_header(head, index_size=index_size, path=index_path)
            preamble = file.read(header.metadata_size)
            index_crc = crc32c(preamble, crc32c(head))
            while chunk := file.read(8 << 20):
                index_crc = crc32c(chunk, index_crc)
        data_info = os.lstat(data_path)
    except FileNotFoundError as error:
        raise MissingFileError("missing shard file", path=error.filename) from None
    except OSError as error:
        if error.errno == errno.ELOOP:  # O_NOFOLLOW met a link
            raise FormatError(SHARD_FILE_NOT_REGULAR, path=index_path) from None
        raise StorageError(f"cannot read shard: {error.strerror}", path=index_path) from None
    if not stat.S_ISREG(data_info.st_mode):
        raise FormatError(SHARD_FILE_NOT_REGULAR, path=data_path)
    data_size = data_info.st_size
    if data_size != header.data_size:
        raise FormatError(f"data file is {data_size} bytes, its index expects {header.data_size}", path=data_path)
    codec_params, _ = decode_metadata(preamble, path=index_path)
    entry = ShardEntry(name, header.record_count, header.data_size, index_size, index_crc, header.data_crc32c)
    return entry, header, codec_params

"""WebDataset tar shards as a source of ``varstore convert``: one msgpack record per sample.

A sample is what WebDataset's own reader groups: consecutive members of one tar whose names share a key, the name
up to the first dot of its last component (``train/0001.jpg`` and ``train/0001.seg.png`` are the sample
``train/0001`` with the fields ``jpg`` and ``seg.png``; extensions are lowercased), so a sample never spans two
tars. The record is ``{"__key__": key, extension: bytes, ...}`` in member order; with `decode`, the extensions
WebDataset's basic handlers decode safely are decoded as they decode them (see `_DECODERS`; pickles, tensors and
images stay bytes). As in WebDataset, members named ``__...__`` (its metadata) and names without a dot are left
out, and a sample holding one extension twice is refused.

Each tar is streamed (tarfile's ``r|*`` mode: plain, gzip, bzip2 or xz) and never extracted: directory members
are skipped, any other member that is not a regular file (a link, a device, a FIFO) is refused by name, and so is a
member whose header claims more bytes than the archive has, before it is read. A sample is held whole in memory
while it is written, so one over `max_record_bytes` is refused; memory stays bounded by that whatever the tars
hold. With workers, the tars are shared among them in order.
"""

from __future__ import annotations

import bz2
import gzip
import json
import lzma
import re
import tarfile
import zlib
from typing import Any, Callable, Iterator

from ..dataset.writer import ShardedWriter
from ..errors import CommandError
from ..progress import Counter
from .input_files import FilesSource, InputFile, open_input
from .source_base import append_record

# What a damaged or cut tar raises, through tarfile and each decompressor.
_READ_ERRORS = (tarfile.TarError, OSError, EOFError, zlib.error, lzma.LZMAError)
# The decompressor of each compressed tar, by its first bytes (tarfile's own r|* checks no gzip CRC: these do).
_DECOMPRESSORS: dict[bytes, Callable[[Any], Any]] = {
    b"\x1f\x8b": lambda raw: gzip.GzipFile(fileobj=raw, mode="rb"), b"BZh": bz2.BZ2File, b"\xfd7zXZ\x00": lzma.LZMAFile,
}

# WebDataset's tariterators: base_plus_ext (the key and the extensions), its metadata names and skip_meta.
_KEY_AND_EXTENSION = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")
_METADATA = re.compile(r"__[^/]*__($|/)")


def _text(data: bytes) -> str:
    return data.decode("utf-8")


def _json(data: bytes) -> Any:
    return json.loads(data)


# WebDataset's autodecode.decoders for the types a msgpack record holds as they are; by the last extension.
_DECODERS: dict[str, Callable[[bytes], Any]] = {
    **dict.fromkeys(("txt", "text", "transcript"), _text),
    **dict.fromkeys(("cls", "cls2", "index", "inx", "id"), int),
    **dict.fromkeys(("json", "jsn"), _json),
}


class WebDatasetSource(FilesSource):
    """The tars that `spec` names (a path, URL, brace pattern, glob or ``::`` list; `input_files`), read in order."""

    codec = "msgpack"

    def __init__(self, spec: str, *, decode: bool, max_record_bytes: int,
                 storage_options: dict[str, Any] | None) -> None:
        self.spec, self.decode, self.max_record_bytes = spec, decode, max_record_bytes
        self.storage_options = storage_options

    def write_part(self, writer: ShardedWriter, progress: Counter, part: dict[str, Any]) -> None:
        for name, size in part["files"]:
            for where, sample in self.samples(InputFile(name, size), progress):
                append_record(writer, sample, where)

    def samples(self, file: InputFile, progress: Counter) -> Iterator[tuple[str, dict[str, Any]]]:
        """(where it was read, the sample) of each sample of the tar `file`, reporting the bytes read."""
        with open_input(file, self.storage_options) as raw:
            members = _TarMembers(file, raw, self.max_record_bytes)
            sample: dict[str, Any] = {}
            where, reported = "", 0
            for member, extension, key in members:
                if sample and key != sample["__key__"]:
                    yield where, sample
                    sample = {}
                    progress(raw.tell() - reported)
                    reported = raw.tell()
                if not sample:
                    sample, where, size = {"__key__": key}, f"{file.name}, sample {key!r}", 0
                if extension in sample:
                    raise CommandError(f"{where}: the member {member.name!r} repeats the extension {extension!r}; "
                                       "a sample holds each extension once")
                size += member.size
                if size > self.max_record_bytes:
                    raise CommandError(f"{where}: its members reach {size:,} bytes at {member.name!r}, over "
                                       f"--max-record-bytes ({self.max_record_bytes:,}); a sample is held whole in "
                                       "memory")
                sample[extension] = self._field(members.read(member), extension, f"{where}, member {member.name!r}")
            if sample:
                yield where, sample
            members.check_end()
            progress(file.size - reported)

    def _field(self, data: bytes, extension: str, where: str) -> Any:
        decoder = _DECODERS.get(extension.rsplit(".", 1)[-1]) if self.decode else None
        if decoder is None:
            return data
        try:
            return decoder(data)
        except ValueError as error:  # UnicodeDecodeError and JSONDecodeError included
            raise CommandError(f"{where}: cannot decode it as WebDataset decodes .{extension}: {error}") from None
        except RecursionError:
            raise CommandError(f"{where}: JSON nested too deeply to read") from None


class _TarMembers:
    """The members of one streamed tar that carry a sample's field, as (member, extension, key), each checked
    before it is read; `read` reads the current one. Errors name the tar and the member reached."""

    def __init__(self, file: InputFile, raw: Any, max_record_bytes: int) -> None:
        self.file, self.max_record_bytes, self.last = file, max_record_bytes, None
        head = raw.read(6)
        raw.seek(0)
        decompressor = next((opener for magic, opener in _DECOMPRESSORS.items() if head.startswith(magic)), None)
        self.plain = decompressor is None  # only a plain tar's offsets are the file's: compressed ones outgrow it
        self.tar_bytes = raw if decompressor is None else decompressor(raw)
        try:
            self.stream = tarfile.open(fileobj=self.tar_bytes, mode="r|")
        except _READ_ERRORS as error:
            raise CommandError(f"{file.name}: not a tar archive (plain, gzip, bzip2 or xz) tarfile can read: "
                               f"{error}") from None

    def __iter__(self) -> Iterator[tuple[tarfile.TarInfo, str, str]]:
        while (member := self._next()) is not None:
            self.stream.members = []  # the stream would keep every member's header: memory grows with the tar
            if member.isdir():
                continue
            self.last = member.name
            if not member.isreg():
                raise CommandError(f"{self.file.name}: the member {member.name!r} is {_kind(member)}, not a regular "
                                   "file; convert reads a sample's fields from regular members only")
            if self.plain and member.offset_data + member.size > self.file.size:
                raise CommandError(f"{self.file.name}: the member {member.name!r} claims {member.size:,} bytes from "
                                   f"byte {member.offset_data:,}, past the end of the {self.file.size:,}-byte archive")
            if member.size > self.max_record_bytes:
                raise CommandError(f"{self.file.name}: the member {member.name!r} holds {member.size:,} bytes, over "
                                   f"--max-record-bytes ({self.max_record_bytes:,}); a sample is held whole in memory")
            name = member.name
            if ("/" not in name and name.startswith("__") and name.endswith("__")) or _METADATA.match(name):
                continue
            match = _KEY_AND_EXTENSION.match(name)
            if match is not None:
                yield member, match.group(2).lower(), match.group(1)

    def _next(self) -> tarfile.TarInfo | None:
        try:
            return self.stream.next()
        except _READ_ERRORS as error:
            place = self.file.name if self.last is None else f"{self.file.name}, after the member {self.last!r}"
            raise CommandError(f"{place}: the tar is damaged or cut short: {error}") from None

    def check_end(self) -> None:
        """Read a compressed tar to the end of its compressed stream, past the tar's end marker, so that its
        decompressor checks what tarfile stops short of: the stream's CRC and length, and that it is whole."""
        if self.plain:
            return
        try:
            while self.tar_bytes.read(1 << 16):
                pass
        except _READ_ERRORS as error:
            raise CommandError(f"{self.file.name}: the compressed tar is damaged or cut short after the member "
                               f"{self.last!r}: {error}") from None

    def read(self, member: tarfile.TarInfo) -> bytes:
        """The bytes of `member`, the member just yielded."""
        try:
            extracted = self.stream.extractfile(member)
            assert extracted is not None  # a regular member always has a file
            return extracted.read()
        except _READ_ERRORS as error:
            raise CommandError(f"{self.file.name}, member {member.name!r}: the tar is damaged or cut short: "
                               f"{error}") from None


def _kind(member: tarfile.TarInfo) -> str:
    """What a member that is not a regular file or a directory is, as a sentence names it."""
    if member.issym():
        return f"a symbolic link to {member.linkname!r}"
    if member.islnk():
        return f"a hard link to {member.linkname!r}"
    return {tarfile.CHRTYPE: "a character device", tarfile.BLKTYPE: "a block device",
            tarfile.FIFOTYPE: "a FIFO"}.get(member.type, f"a member of tar type {member.type!r}")

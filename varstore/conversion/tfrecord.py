"""TFRecord files as a source of ``varstore convert``: each record a ``tf.train.Example`` decoded into a msgpack
record, or (codec ``bytes``) the record's bytes as they are; read without TensorFlow.

A TFRecord file is a sequence of records, each framed as TensorFlow writes it (tensorflow/core/lib/io/record_writer):
the data's length as a little-endian uint64, the masked CRC32C of those 8 bytes, the data, and the masked CRC32C of
the data, a masked CRC being ``((crc >> 15 | crc << 17) + 0xA282EAD8) mod 2**32``. Both CRCs are checked; a file cut
short or damaged is refused with its name and the record's number (from 0). A record over `max_record_bytes`, or
whose length runs past the end of an uncompressed file, is refused before it is read. A gzip-compressed file
(``compression_type="GZIP"``, or a name ending ``.gz``) is decompressed as it is streamed.

An Example is decoded from protobuf's wire format by `decode_example`, a bounded decoder of the five messages
involved (Example, Features, Feature, BytesList, FloatList, Int64List): ``{name: value}``, sorted by name, with a
bytes_list as its one bytes value, or a list of bytes when it holds none or several; a float_list as a float32
array; an int64_list as an int64 array; a Feature of no kind as None. As protobuf parses, unknown fields are
skipped, packed and unpacked numbers both read, a repeated map key keeps its last value, a repeated message is
merged and a map entry holding an unknown field is left out of the map; groups (wire types 3 and 4, which no
Example holds) are refused. When protobuf is installed (the ``tfrecord`` extra), `example_decoder` gives
`tfrecord_protobuf`'s fast path, which reads every Example to the same values through protobuf's C parser.
"""

from __future__ import annotations

import gzip
import struct
import zlib
from typing import Any, BinaryIO, Callable, Iterator

import numpy as np

from ..dataset.writer import ShardedWriter
from ..errors import CommandError, UsageError
from ..format.checksum import crc32c
from ..progress import Counter
from .input_files import FilesSource, InputFile, open_input
from .source_base import append_record

_MASK_DELTA = 0xA282EAD8
_HEADER = struct.Struct("<QI")  # the length, and its masked CRC
_FOOTER_BYTES = 4
_SHORT_PACKED_BYTES = 32  # packed varints up to this many bytes are decoded one by one, longer ones by numpy
COMPRESSION_TYPES = ("GZIP", "NONE")


def masked_crc32c(data: bytes | memoryview) -> int:
    """The CRC32C of `data`, masked as TFRecord stores it (so that a CRC of CRCs is not trivially related)."""
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def framed_records(stream: BinaryIO, name: str, *, size: int | None, max_record_bytes: int) -> Iterator[bytes]:
    """The data of each record of the TFRecord stream `stream` (of `size` bytes if known, None when compressed),
    checked against both CRCs; errors name the file `name` and the record's number."""
    number, offset = 0, 0
    while header := _read(stream, _HEADER.size, name, number):
        where = f"{name}, record {number}"
        if len(header) < _HEADER.size:
            raise CommandError(f"{where}: cut short: {len(header)} of the {_HEADER.size} bytes of its length and "
                               "the length's CRC")
        length, length_crc = _HEADER.unpack(header)
        if masked_crc32c(header[:8]) != length_crc:
            raise CommandError(f"{where}: damaged: the CRC32C of its length does not match (the file is corrupt, "
                               "or not a TFRecord file)")
        if length > max_record_bytes:
            raise CommandError(f"{where}: {length:,} bytes, over --max-record-bytes ({max_record_bytes:,}); "
                               "a record is held whole in memory")
        end = offset + _HEADER.size + length + _FOOTER_BYTES
        if size is not None and end > size:
            raise CommandError(f"{where}: cut short: its {length:,} bytes and CRC end at byte {end:,}, past the end "
                               f"of the {size:,}-byte file")
        data = _read(stream, length + _FOOTER_BYTES, name, number)
        if len(data) < length + _FOOTER_BYTES:
            raise CommandError(f"{where}: cut short: {len(data):,} of its {length + _FOOTER_BYTES:,} bytes of data "
                               "and CRC")
        payload = memoryview(data)[:length]
        if masked_crc32c(payload) != int.from_bytes(data[length:], "little"):
            raise CommandError(f"{where}: damaged: the CRC32C of its {length:,} bytes of data does not match")
        yield bytes(payload)
        number, offset = number + 1, end


def _read(stream: BinaryIO, count: int, name: str, number: int) -> bytes:
    """Up to `count` bytes of `stream`, fewer only at its end; a decompression error names the record reached."""
    try:
        data = stream.read(count)
        while len(data) < count and (more := stream.read(count - len(data))):
            data += more
    except (OSError, EOFError, zlib.error) as error:  # gzip.BadGzipFile is an OSError
        raise CommandError(f"{name}, record {number}: cannot decompress it (gzip): {error}") from None
    return data


class _Wire:
    """A cursor over one protobuf message's bytes; every length is checked against the bytes left."""

    def __init__(self, data: memoryview, where: str) -> None:
        self.data, self.position, self.where = data, 0, where

    def fields(self) -> Iterator[tuple[int, int, Any]]:
        """(field number, wire type, value) of each field: an int for varints (0), bytes of 8 (1) or 4 (5) bytes
        for fixed ones, a memoryview of the payload for length-delimited ones (2)."""
        while self.position < len(self.data):
            tag = self.varint(exact=True)
            number, wire_type = tag >> 3, tag & 7
            if number == 0:
                raise CommandError(f"{self.where}: a field numbered 0, which protobuf never writes")
            if wire_type == 0:
                yield number, wire_type, self.varint(exact=False)
            elif wire_type == 2:
                yield number, wire_type, self.take(self.varint(exact=True))
            elif wire_type in (1, 5):
                yield number, wire_type, self.take(8 if wire_type == 1 else 4)
            else:
                group = wire_type in (3, 4)
                kind = "a group, which tf.train.Example never holds" if group else "not a protobuf wire type"
                raise CommandError(f"{self.where}: field {number} has wire type {wire_type}, {kind}")

    def varint(self, *, exact: bool) -> int:
        """The next varint: a tag or length (`exact`) is refused past 64 bits; a value keeps its low 64 bits, as
        protobuf reads a 10-byte varint whose last byte holds more."""
        position = self.position
        if position < len(self.data) and self.data[position] < 0x80:  # one byte: most tags and lengths
            self.position = position + 1
            return self.data[position]
        value, shift = 0, 0
        while True:
            if self.position >= len(self.data):
                raise CommandError(f"{self.where}: a varint runs past the end of its message")
            byte = self.data[self.position]
            self.position += 1
            value |= (byte & 0x7F) << shift
            if byte < 0x80:
                break
            shift += 7
            if shift >= 70:
                raise CommandError(f"{self.where}: a varint longer than 10 bytes")
        if exact and value >> 64:
            raise CommandError(f"{self.where}: a varint of more than 64 bits, past protobuf's 64")
        return value & 0xFFFF_FFFF_FFFF_FFFF

    def varints(self) -> Iterator[int]:
        """The values of packed varints, one at a time: faster than `_packed_varints` for a few."""
        while self.position < len(self.data):
            yield self.varint(exact=False)

    def take(self, count: int) -> memoryview:
        left = len(self.data) - self.position
        if count > left:
            raise CommandError(f"{self.where}: a length of {count:,} bytes runs past the end of its message "
                               f"({left:,} bytes left)")
        self.position += count
        return self.data[self.position - count : self.position]


def decode_example(data: bytes | memoryview, where: str) -> dict[str, Any]:
    """The features of the serialized ``tf.train.Example`` `data` (see the module's docstring for their values);
    a malformed message is refused naming `where`."""
    entries: dict[str, list[memoryview]] = {}  # each feature's serialized Feature messages, merged when decoded
    for number, wire_type, features in _Wire(memoryview(data), where).fields():
        if number != 1 or wire_type != 2:  # Example.features; anything else is a field unknown to Example
            continue
        for entry_number, entry_type, entry in _Wire(features, where).fields():
            if entry_number == 1 and entry_type == 2:  # Features.feature, a map<string, Feature> entry
                found = _map_entry(entry, where)
                if found is not None:
                    entries[found[0]] = found[1]
    # Sorted by name: protobuf writes a map in no fixed order (Python's, in another each run), the record in one.
    return {name: _feature(entries[name], f"{where}, feature {name!r}") for name in sorted(entries)}


def _map_entry(entry: memoryview, where: str) -> tuple[str, list[memoryview]] | None:
    """The key of a Features map entry and its value's Feature messages (several when repeated, to be merged); None
    for an entry holding an unknown field, which protobuf keeps as an unknown field of Features, out of the map."""
    key, values = b"", []
    for number, wire_type, value in _Wire(entry, where).fields():
        if number == 1 and wire_type == 2:
            key = value
        elif number == 2 and wire_type == 2:
            values.append(value)
        else:
            return None
    try:
        return bytes(key).decode("utf-8"), values
    except UnicodeDecodeError:
        raise CommandError(f"{where}: a feature name that is not UTF-8: {bytes(key)[:64]!r}") from None


def _feature(messages: list[memoryview], where: str) -> Any:
    """A Feature's value from its messages merged in order: its kind is the last one set (a oneof), and lists of one
    kind in a row are joined, as protobuf merges them."""
    kind, values = 0, []
    for message in messages:
        for number, wire_type, value in _Wire(message, where).fields():
            if number not in (1, 2, 3) or wire_type != 2:
                continue
            if number != kind:
                kind, values = number, []
            values.extend(_list_values(number, value, where))
    if kind == 1:
        return values[0] if len(values) == 1 else values
    if kind == 2:
        return np.concatenate(values).astype(np.float32) if values else np.zeros(0, np.float32)
    if kind == 3:
        return np.concatenate(values).view(np.int64) if values else np.zeros(0, np.int64)
    return None


def _list_values(kind: int, message: memoryview, where: str) -> list[Any]:
    """The values of one BytesList (1), FloatList (2) or Int64List (3) message: bytes, or arrays (packed or of one
    value each) of little-endian float32 or of unsigned 64-bit integers (two's complement, made signed by the
    caller)."""
    values: list[Any] = []
    for number, wire_type, value in _Wire(message, where).fields():
        if number != 1:
            continue
        if kind == 1 and wire_type == 2:
            values.append(bytes(value))
        elif kind == 2 and wire_type in (2, 5):
            if len(value) % 4:
                raise CommandError(f"{where}: packed floats of {len(value)} bytes, not a multiple of 4")
            values.append(np.frombuffer(value, "<f4"))
        elif kind == 3 and wire_type == 0:
            values.append(np.array([value], np.uint64))
        elif kind == 3 and wire_type == 2:
            values.append(_packed_varints(value, where) if len(value) > _SHORT_PACKED_BYTES
                          else np.array(list(_Wire(value, where).varints()), np.uint64))
    return values


def _packed_varints(data: memoryview, where: str) -> np.ndarray:
    """The unsigned 64-bit integers of packed varints (each its low 64 bits, as `_Wire.varint` reads a value),
    decoded all at once: a token list holds thousands."""
    octets = np.frombuffer(data, np.uint8)
    ends = np.flatnonzero(octets < 0x80)  # a varint's last byte is the one with its high bit clear
    if len(ends) == 0 or ends[-1] != len(octets) - 1:
        if len(octets) == 0:
            return np.zeros(0, np.uint64)
        raise CommandError(f"{where}: a varint runs past the end of its message")
    starts = np.concatenate(([0], ends[:-1] + 1))
    lengths = ends - starts + 1
    if lengths.max() > 10:
        raise CommandError(f"{where}: a varint longer than 10 bytes")
    place = np.arange(len(octets)) - np.repeat(starts, lengths)  # each byte's place in its varint, 0 to 9
    # A tenth byte's bits past the 64th shift out, as protobuf drops them.
    parts = (octets & 0x7F).astype(np.uint64) << (place * 7).astype(np.uint64)
    return np.bitwise_or.reduceat(parts, starts)


def example_decoder() -> Callable[[bytes, str], dict[str, Any]]:
    """`decode_example`, or its fast path through protobuf's parser when protobuf is installed (same values)."""
    try:
        from .tfrecord_protobuf import parse_example
    except ImportError:
        return decode_example

    def decode_example_with_protobuf(data: bytes, where: str) -> dict[str, Any]:
        values = parse_example(data)
        return decode_example(data, where) if values is None else values

    return decode_example_with_protobuf


class TFRecordSource(FilesSource):
    """The TFRecord files that `spec` names (a path, URL, brace pattern, glob or ``::`` list; `input_files`)."""

    def __init__(self, spec: str, *, codec: str | None, compression_type: str | None, max_record_bytes: int,
                 storage_options: dict[str, Any] | None) -> None:
        if codec not in (None, "bytes"):
            raise UsageError(f"--codec {codec} does not apply to TFRecord files: --codec bytes keeps each record's "
                             "bytes; without it each tf.train.Example is decoded")
        if compression_type is not None and compression_type.upper() not in COMPRESSION_TYPES:
            raise UsageError(f"--compression-type {compression_type} is not one of {', '.join(COMPRESSION_TYPES)}")
        self.codec = codec or "msgpack"
        self.spec, self.max_record_bytes, self.storage_options = spec, max_record_bytes, storage_options
        self.compression_type = None if compression_type is None else compression_type.upper()

    def write_part(self, writer: ShardedWriter, progress: Counter, part: dict[str, Any]) -> None:
        decode = example_decoder()
        for name, size in part["files"]:
            for number, data in enumerate(self._records(name, size)):
                where = f"{name}, record {number}"
                append_record(writer, data if self.codec == "bytes" else decode(data, where), where)
            progress(size)

    def _records(self, name: str, size: int) -> Iterator[bytes]:
        """The records of the file `name` (of `size` bytes), decompressed if it is gzipped."""
        gzipped = self.compression_type == "GZIP" or (self.compression_type is None and name.lower().endswith(".gz"))
        with open_input(InputFile(name, size), self.storage_options) as raw, (gzip.GzipFile(fileobj=raw) if gzipped else raw) as stream:
            yield from framed_records(stream, name, size=None if gzipped else size,
                                      max_record_bytes=self.max_record_bytes)

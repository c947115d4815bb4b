"""The spec-only reader as it was for format 2.0, kept unchanged: the "2.0 reader" that must refuse 3.x shards (§1.7).

A reader of varstore shards and datasets written from spec/FORMAT.md alone: the independent judge of its rules.

It imports nothing from varstore (only the standard library, numpy, and spec_writer's canonical JSON). Every
refusal is a `SpecError` whose `rule` names the spec section (and §1.3 step)
it enforces, and the reader is staged as the spec is, so a test can tell
*when* a reader must refuse:

- `open_shard(prefix)`: the checks of §1.3 at open, in their order;
- `Shard.record(i)`: the checks of every read of record i (§1.3, §2);
- `Shard.verify()`: full verification (§1.3);
- `open_dataset(directory)`, `Dataset.record(g)`, `Dataset.verify()`: the same for a dataset (§3, §3.1), which checks
  at open only what §3.1 says a reader must check then (every shard's file sizes, §1.3 steps 1-6 of its header and
  the header's agreement with its entry, and all of them for a shard of 0 records), and the rest of a shard's
  open checks before its first read.

`read_shard` and `read_dataset` do all three and return everything, decoded.
Clarity over speed: it reads whole files and decodes MessagePack in Python. Compressed shards (format 2.0,
§1.6) are read with its own parse of zstd frame headers and blocks; only decoding a frame's blocks is left to a
zstd library (python-zstandard: RFC 8878 defines what it decodes).
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

MAGIC = b"\x89VSI\r\n\x1a\n"
ALLOWED_DTYPES = {"|b1", "|i1", "|u1", "<i2", "<u2", "<i4", "<u4", "<i8", "<u8", "<f2", "<f4", "<f8", "<c8", "<c16"}
CODEC_NAMES = {0: "bytes", 1: "str", 2: "ndarray", 3: "msgpack"}
COMPRESSION_NAMES = {1: "zstd", 2: "zstd-dict"}
FRAME_MAGIC = b"\x28\xb5\x2f\xfd"
DICTIONARY_MAGIC = b"\x37\xa4\x30\xec"
MAX_METADATA_SIZE = 16 << 20
MAX_JSON_DEPTH = 64
MAX_MSGPACK_DEPTH = 512
MAX_MANIFEST_SIZE = 64 << 20
SHARD_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,199}")
MANIFEST_MEMBERS = {"format", "version", "codec", "metadata", "shards"}
SHARD_MEMBERS = {"name", "records", "data_size", "index_size", "index_crc32c", "data_crc32c"}


class SpecError(Exception):
    """A file or record the spec says a reader must refuse; `rule` is the section (and step) it breaks."""

    def __init__(self, rule: str, message: str) -> None:
        super().__init__(f"{rule}: {message}")
        self.rule = rule


def require(condition: Any, rule: str, message: str) -> None:
    if not condition:
        raise SpecError(rule, message)


# -- CRC32C (the preamble) ---------------------------------------------------------------------


def _crc32c_table() -> list[int]:
    table = []
    for byte in range(256):
        value = byte
        for _ in range(8):
            value = (value >> 1) ^ 0x82F63B78 if value & 1 else value >> 1
        table.append(value)
    return table


_TABLE = _crc32c_table()


def crc32c(data: bytes, crc: int = 0) -> int:
    """CRC32C of `data`; `crc` is the CRC32C of bytes before it, so crc32c(b, crc32c(a)) == crc32c(a + b)."""
    value = crc ^ 0xFFFFFFFF
    for byte in data:
        value = _TABLE[(value ^ byte) & 0xFF] ^ (value >> 8)
    return value ^ 0xFFFFFFFF


def crc32c_combine(crc_a: int, crc_b: int, length_b: int) -> int:
    """CRC32C of A + B from the CRCs of A and B. The CRC is affine in its input, so running B from crc_a instead of
    from 0 changes the result by exactly what running zeros from crc_a instead of 0 does (a log-time method exists;
    this one is short)."""
    zeros = bytes(length_b)
    return crc_b ^ crc32c(zeros, crc_a) ^ crc32c(zeros, 0)


# -- strict JSON (§1.4) -----------------------------------------------------------------------


STRUCTURE_COSTS = {"{": 144, "[": 80, ":": 48, ",": 8}  # §1.4's memory rule, per character outside strings


def _outside_strings(text: str) -> Iterator[str]:
    """The characters of a JSON text that lie outside its strings (quotes included, escapes honoured)."""
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        else:
            yield char


def json_structure_cost(text: str) -> int:
    """§1.4's cost of a JSON text: 144 per `{`, 80 per `[`, 48 per `:`, 8 per `,`, outside strings."""
    return sum(STRUCTURE_COSTS.get(char, 0) for char in _outside_strings(text))


def json_depth(text: str) -> int:
    """How deep arrays and objects nest, counting brackets outside strings, without parsing."""
    depth = deepest = 0
    for char in _outside_strings(text):
        if char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def parse_strict_json(raw: bytes, rule: str) -> Any:
    """RFC 8259 JSON under the rules of §1.4: no BOM, valid UTF-8, depth <= 64, no NaN/Infinity, finite floats,
    integers in [-2^63, 2^64), no repeated member names, no lone surrogate escapes."""

    def constant(name: str) -> Any:
        raise SpecError(rule, f"{name} is not a JSON number")

    def finite(text: str) -> float:
        value = float(text)
        require(math.isfinite(value), rule, f"number {text} overflows a 64-bit float")
        return value

    def integer(text: str) -> int:
        # 2^64 has 20 digits and JSON has no leading zeros, so a longer integer is out of range; int() refuses past
        # 4300 digits by default, so it is not asked.
        require(len(text.lstrip("-")) <= 20, rule, f"integer of {len(text)} characters is outside [-2^63, 2^64)")
        value = int(text)
        require(-(1 << 63) <= value < 1 << 64, rule, f"integer {text} is outside [-2^63, 2^64)")
        return value

    def unique_members(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        names = [name for name, _ in pairs]
        require(len(set(names)) == len(names), rule, f"an object repeats a member name among {names}")
        return dict(pairs)

    require(not raw.startswith(b"\xef\xbb\xbf"), rule, "JSON starts with a byte order mark")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise SpecError(rule, f"JSON is not valid UTF-8: {error}") from None
    require(json_depth(text) <= MAX_JSON_DEPTH, rule, f"JSON nests deeper than {MAX_JSON_DEPTH}")
    limit = 16 * len(raw) + (128 << 10)
    require(json_structure_cost(text) <= limit, rule, f"JSON structure costs over 16 x its {len(raw)} bytes + 128 KiB")
    try:
        value = json.loads(
            text, parse_constant=constant, parse_float=finite, parse_int=integer, object_pairs_hook=unique_members
        )
    except json.JSONDecodeError as error:
        raise SpecError(rule, f"not JSON: {error}") from None
    require(not _holds_surrogate(value), rule, "a string holds a lone surrogate escape")
    return value


def _holds_surrogate(value: Any) -> bool:
    if isinstance(value, str):
        return any(0xD800 <= ord(char) <= 0xDFFF for char in value)
    if isinstance(value, dict):
        return any(_holds_surrogate(name) or _holds_surrogate(item) for name, item in value.items())
    if isinstance(value, list):
        return any(_holds_surrogate(item) for item in value)
    return False


# -- codecs (§2) -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Codec:
    name: str
    params: dict
    dtype: np.dtype | None = None
    shape: tuple[int, ...] = ()

    @property
    def row_size(self) -> int:
        return self.dtype.itemsize * math.prod(self.shape)


def codec_from(name: str, params: Any, rule: str) -> Codec:
    """A codec from its name and parameters, which are exact: `{}`, or for ndarray exactly "dtype" and "shape"."""
    require(isinstance(params, dict), rule, "codec parameters must be an object")
    if name != "ndarray":
        require(params == {}, rule, f"the {name} codec has no parameters, found {sorted(params)}")
        return Codec(name, params)
    require(set(params) == {"dtype", "shape"}, rule, f'ndarray parameters are exactly "dtype" and "shape", found {sorted(params)}')
    dtype, shape = params["dtype"], params["shape"]
    require(isinstance(dtype, str) and dtype in ALLOWED_DTYPES, "§2.1", f"dtype {dtype!r} is not allowed")
    require(isinstance(shape, list) and len(shape) <= 31, "§2.1", "shape is a list of at most 31 integers")
    require(all(type(dim) is int and 1 <= dim < 1 << 32 for dim in shape), "§2.1", f"shape {shape} has a dimension outside [1, 2^32)")
    codec = Codec(name, params, np.dtype(dtype), tuple(shape))
    require(codec.row_size < 1 << 63, "§2.1", "a row is 2^63 bytes or more")
    return codec


def decode_record(codec: Codec, payload: bytes) -> Any:
    if codec.name == "bytes":
        return payload
    if codec.name == "str":
        try:
            return payload.decode("utf-8")
        except UnicodeDecodeError as error:
            raise SpecError("§2", f"str record is not valid UTF-8: {error}") from None
    if codec.name == "ndarray":
        require(len(payload) % codec.row_size == 0, "§2.1", f"{len(payload)} bytes are not whole {codec.row_size}-byte rows")
        return _array_of(codec.dtype, payload, (-1, *codec.shape), "§2.1")
    return decode_msgpack(payload)


def _array_of(dtype: np.dtype, body: bytes, shape: tuple[int, ...], rule: str) -> np.ndarray:
    if dtype.str == "|b1":
        require(set(body) <= {0, 1}, rule, "a |b1 element is the byte 0 or 1")
    return np.frombuffer(body, dtype).reshape(shape)


# -- MessagePack (§2.2) ------------------------------------------------------------------------


def decode_msgpack(payload: bytes) -> Any:
    """Exactly one MessagePack object under §2.2: str or integer keys, none twice, containers nested at most 512
    deep and claiming no more elements than bytes remain, extension type 1 only."""
    spent = [0]
    value, end = _unpack(payload, 0, 0, spent)
    require(end == len(payload), "§2.2", f"{len(payload) - end} bytes follow the object")
    limit = 16 * len(payload) + 131072
    require(spent[0] <= limit, "§2.2", f"its objects cost {spent[0]}, over 16 x its {len(payload)} bytes + 131072 = {limit}")
    return value


def _cost(data: bytes, position: int) -> int:
    """§2.2's memory cost of the object whose first byte is at `position`, without its elements."""
    tag = data[position]
    if 0x80 <= tag <= 0x8F or tag in (0xDE, 0xDF):
        entries = tag & 0x0F if tag <= 0x8F else _unsigned(data, position + 1, 2 if tag == 0xDE else 4)
        return 144 + 72 * entries
    if 0x90 <= tag <= 0x9F or tag in (0xDC, 0xDD):
        return 80
    if tag <= 0x7F or tag >= 0xFB or tag in (0xC0, 0xC2, 0xC3, 0xCC):
        return 8
    if tag >= 0xE0 or 0xCA <= tag <= 0xD3:
        return 40
    if 0xA0 <= tag <= 0xBF or 0xD9 <= tag <= 0xDB:
        header = 1 if tag <= 0xBF else 1 + (1 << (tag - 0xD9))
        length = tag & 0x1F if tag <= 0xBF else _unsigned(data, position + 1, header - 1)
        text = _take(data, position + header, length)
        return 8 if length <= 1 else 72 + length if text.isascii() else 88 + 4 * length
    if 0xC4 <= tag <= 0xC6:
        length = _unsigned(data, position + 1, 1 << (tag - 0xC4))
        return 8 if length <= 1 else 56 + length
    if 0xC7 <= tag <= 0xC9:
        return 288 + 3 * _unsigned(data, position + 1, 1 << (tag - 0xC7))
    if 0xD4 <= tag <= 0xD8:
        return 288 + 3 * (1 << (tag - 0xD4))
    return 0  # c1, which _unpack refuses


def _take(data: bytes, position: int, size: int) -> bytes:
    require(position + size <= len(data), "§2.2", "the record ends inside an object")
    return data[position : position + size]


def _unsigned(data: bytes, position: int, size: int) -> int:
    return int.from_bytes(_take(data, position, size), "big")


def _unpack(data: bytes, position: int, depth: int, spent: list[int]) -> tuple[Any, int]:
    """The object at `position` and the position after it; `depth` counts the containers around it, `spent[0]`
    sums §2.2's costs of the objects unpacked so far."""
    tag = _take(data, position, 1)[0]
    spent[0] += _cost(data, position)
    position += 1
    if 0x80 <= tag <= 0x9F or 0xDC <= tag <= 0xDF:  # fixmap, fixarray, array 16/32, map 16/32
        is_map = tag < 0x90 or tag >= 0xDE
        if tag <= 0x9F:
            count = tag & 0x0F
        else:
            size_bytes = 2 if tag in (0xDC, 0xDE) else 4
            count, position = _unsigned(data, position, size_bytes), position + size_bytes
        require(depth < MAX_MSGPACK_DEPTH, "§2.2", f"containers nest deeper than {MAX_MSGPACK_DEPTH}")
        require(count <= len(data) - position, "§2.2", f"a container claims {count} elements, more than the bytes left")
        items = []
        for _ in range(2 * count if is_map else count):
            item, position = _unpack(data, position, depth + 1, spent)
            items.append(item)
        return (_map(items) if is_map else items), position
    if tag <= 0x7F or tag >= 0xE0:
        return (tag if tag <= 0x7F else tag - 0x100), position
    if 0xA0 <= tag <= 0xBF:
        return _text(data, position, tag & 0x1F)
    if tag in (0xC0, 0xC2, 0xC3):
        return {0xC0: None, 0xC2: False, 0xC3: True}[tag], position
    if tag in (0xC4, 0xC5, 0xC6):  # bin 8/16/32
        size_bytes = 1 << (tag - 0xC4)
        length = _unsigned(data, position, size_bytes)
        return _take(data, position + size_bytes, length), position + size_bytes + length
    if tag in (0xC7, 0xC8, 0xC9):  # ext 8/16/32
        size_bytes = 1 << (tag - 0xC7)
        return _extension(data, position + size_bytes, _unsigned(data, position, size_bytes))
    if tag in (0xCA, 0xCB):
        size = 4 if tag == 0xCA else 8
        return struct.unpack(">f" if size == 4 else ">d", _take(data, position, size))[0], position + size
    if 0xCC <= tag <= 0xCF:  # uint 8/16/32/64
        size = 1 << (tag - 0xCC)
        return _unsigned(data, position, size), position + size
    if 0xD0 <= tag <= 0xD3:  # int 8/16/32/64
        size = 1 << (tag - 0xD0)
        return int.from_bytes(_take(data, position, size), "big", signed=True), position + size
    if 0xD4 <= tag <= 0xD8:  # fixext 1/2/4/8/16
        return _extension(data, position, 1 << (tag - 0xD4))
    require(tag != 0xC1, "§2.2", "the byte c1 is never used")
    size_bytes = 1 << (tag - 0xD9)  # str 8/16/32
    return _text(data, position + size_bytes, _unsigned(data, position, size_bytes))


def _text(data: bytes, position: int, length: int) -> tuple[str, int]:
    try:
        return _take(data, position, length).decode("utf-8"), position + length
    except UnicodeDecodeError as error:
        raise SpecError("§2.2", f"str is not valid UTF-8: {error}") from None


def _map(items: list) -> dict:
    keys = items[0::2]
    require(all(type(key) in (str, int) for key in keys), "§2.2", f"map keys are str or integers, found {keys}")
    result = dict(zip(keys, items[1::2]))
    require(len(result) == len(keys), "§2.2", f"a map holds the same key twice among {keys}")
    return result


def _extension(data: bytes, position: int, length: int) -> tuple[np.ndarray, int]:
    code = int.from_bytes(_take(data, position, 1), "big", signed=True)
    require(code == 1, "§2.2", f"extension type {code} is not defined")
    body = _take(data, position + 1, length)
    return _array_extension(body), position + 1 + length


def _array_extension(data: bytes) -> np.ndarray:
    """Extension type 1: k, dtype string, ndim <= 31, ndim u64 dimensions, the elements in C order."""
    k = _take(data, 0, 1)[0]
    dtype = _take(data, 1, k).decode("latin-1")
    require(dtype in ALLOWED_DTYPES, "§2.2", f"array dtype {dtype!r} is not allowed")
    ndim = _take(data, 1 + k, 1)[0]
    require(ndim <= 31, "§2.2", f"array has {ndim} dimensions, more than 31")
    shape = struct.unpack(f"<{ndim}Q", _take(data, 2 + k, 8 * ndim))
    body = data[2 + k + 8 * ndim :]
    itemsize = np.dtype(dtype).itemsize
    require(math.prod(shape) * itemsize == len(body), "§2.2", f"array of shape {shape} needs {math.prod(shape) * itemsize} bytes, has {len(body)}")
    if 0 in shape:
        leading = shape[: shape.index(0)]
        require(all(dim <= 1 << 16 for dim in leading), "§2.2", f"empty array {shape}: a dimension before its first 0 exceeds 2^16")
        require(math.prod(dim for dim in shape if dim) <= 1 << 24, "§2.2", f"empty array {shape}: non-zero dimensions multiply past 2^24")
    return _array_of(np.dtype(dtype), body, shape, "§2.2")


# -- a shard (§1) ------------------------------------------------------------------------------


@dataclass
class Shard:
    index: bytes
    data: bytes
    header: dict
    codec: Codec
    metadata: dict
    offsets: tuple[int, ...]
    checksums: tuple[int, ...] | None
    sizes: tuple[int, ...] | None = None  # a compressed shard's decoded sizes (§1.6)
    dictionary: bytes = b""

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def data_crc32c_recorded(self) -> bool:
        """§1.2: in 1.x the metadata member "data_crc32c" (checked at open) says the header's field is not recorded."""
        return self.header["major_version"] != 1 or "data_crc32c" not in self.metadata

    def record(self, i: int) -> Any:
        """Record i, with the checks of every read (§1.3): its offsets are in order and inside the data; it decodes."""
        require(0 <= i < len(self), "§1.3 read", f"record {i} does not exist")
        start, end = self.offsets[i], self.offsets[i + 1]
        require(start <= end <= len(self.data), "§1.3 read", f"record {i} has offsets [{start}, {end})")
        if self.sizes is None:
            return decode_record(self.codec, self.data[start:end])
        return decode_record(self.codec, decompress_frame(self.data[start:end], self.sizes[i], self.dictionary))

    def verify(self) -> None:
        """Full verification (§1.3): every byte and every read rule for every record."""
        require(crc32c(self.index[64:]) == self.header["body_crc32c"], "§1.3 verify", "body_crc32c")
        require(all(a <= b for a, b in zip(self.offsets, self.offsets[1:])), "§1.3 read", "offsets decrease")
        for i in range(len(self)):
            payload = self.data[self.offsets[i] : self.offsets[i + 1]]
            require(self.checksums is None or crc32c(payload) == self.checksums[i], "§1.3 verify", f"record {i} checksum")
        require(not self.data_crc32c_recorded or crc32c(self.data) == self.header["data_crc32c"], "§1.3 verify", "data_crc32c")
        for i in range(len(self)):
            self.record(i)


HEADER = struct.Struct("<8sHHBBHQQQIII8sI")
HEADER_FIELDS = ("magic", "major_version", "minor_version", "codec", "reserved", "flags", "record_count", "data_size",
                 "metadata_size", "data_crc32c", "data_edge_crc32c", "body_crc32c", "reserved_tail", "header_crc32c")


def _read_file(path: str, rule: str) -> bytes:
    """The bytes of a shard file opened by its path, links followed (§1.3): it must exist and be a regular file."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise SpecError(rule, f"{path} is missing") from None
    require(stat.S_ISREG(info.st_mode), rule, f"{path} is not a regular file")
    with open(path, "rb") as file:
        return file.read()


def _read_files(prefix: str) -> tuple[bytes, bytes]:
    return _read_file(prefix + ".index", "§1.3 step 1"), _read_file(prefix + ".data", "§1.3 step 8")


def open_shard(prefix: str) -> Shard:
    """The checks of §1.3 at open, in the spec's order (a missing index fails step 1, a missing data file step 8)."""
    index = _read_file(prefix + ".index", "§1.3 step 1")
    header = check_header(index)
    return _open_checked(index, _read_file(prefix + ".data", "§1.3 step 8"), header)


def check_header(index: bytes) -> dict:
    """§1.3 steps 1 to 6: the header's own checks and the index file's size; the header's fields."""
    require(len(index) >= 64 and index[:8] == MAGIC, "§1.3 step 1", "index shorter than 64 bytes or wrong magic")
    header = dict(zip(HEADER_FIELDS, HEADER.unpack_from(index)))
    major = header["major_version"]
    require(major in (1, 2), "§1.3 step 2", f"major version {major}")
    require(header["header_crc32c"] == crc32c(index[:60]), "§1.3 step 3", "header_crc32c")
    header["dictionary_size"], header["dictionary_crc32c"] = struct.unpack("<II", header["reserved_tail"])
    header["compression"] = header["reserved"] if major == 2 else 0
    if major == 1:
        require(header["reserved"] == 0 and header["reserved_tail"] == bytes(8), "§1.3 step 4", "reserved fields are not zero")
    require(header["flags"] & ~1 == 0, "§1.3 step 4", f"unknown flags {header['flags']:#x}")
    if major == 2:
        compression, size = header["compression"], header["dictionary_size"]
        require(compression in (1, 2), "§1.3 step 4", f"compression {compression}")
        require(compression == 2 or (size == 0 and header["dictionary_crc32c"] == 0), "§1.3 step 4", "dictionary fields without a dictionary")
        require(compression == 1 or 8 <= size <= 1 << 20, "§1.3 step 4", f"dictionary_size {size}")
    metadata_size, count, has_checksums = header["metadata_size"], header["record_count"], header["flags"] & 1
    require(metadata_size <= MAX_METADATA_SIZE and header["data_size"] < 1 << 63, "§1.3 step 5", "metadata_size or data_size too large")
    offsets_start = _layout(header)["offsets_start"]
    require(len(index) >= offsets_start + 8, "§1.3 step 6", f"index of {len(index)} bytes ends before offsets[0]")
    per_record = 8 + (4 if has_checksums else 0) + (4 if header["compression"] else 0)
    require(count <= (len(index) - offsets_start - 8) // per_record, "§1.3 step 6", f"{count} records cannot fit")
    require(len(index) == _layout(header)["end"], "§1.3 step 6", "index size")
    return header


def _layout(header: dict) -> dict:
    """Where each section of the index starts (§1.1, §1.6), and where the file ends."""
    count, has_checksums = header["record_count"], header["flags"] & 1
    dictionary_start = (64 + header["metadata_size"] + 7) // 8 * 8
    offsets_start = (dictionary_start + header["dictionary_size"] + 7) // 8 * 8
    checksums_start = offsets_start + 8 * (count + 1)
    sizes_start = checksums_start + (4 * count if has_checksums else 0)
    end = sizes_start + (4 * count if header["compression"] else 0)
    return {"dictionary_start": dictionary_start, "offsets_start": offsets_start, "checksums_start": checksums_start,
            "sizes_start": sizes_start, "end": end}


def _open_checked(index: bytes, data: bytes, header: dict) -> Shard:
    """§1.3 steps 7 to 10, for a header that passed steps 1 to 6: the shard, ready to read."""
    metadata_size, count, has_checksums = header["metadata_size"], header["record_count"], header["flags"] & 1
    layout = _layout(header)
    offsets_start, checksums_start = layout["offsets_start"], layout["checksums_start"]
    dictionary_start, dictionary_end = layout["dictionary_start"], layout["dictionary_start"] + header["dictionary_size"]
    padding = index[64 + metadata_size : dictionary_start] + index[dictionary_end:offsets_start]
    require(not any(padding), "§1.3 step 7", "padding after the metadata is not zero")
    metadata = parse_strict_json(index[64 : 64 + metadata_size], "§1.4")
    require(isinstance(metadata, dict), "§1.4", "metadata is not an object")
    require(isinstance(metadata.get("codec"), dict) and isinstance(metadata.get("user"), dict), "§1.4", '"codec" and "user" objects')
    require(header["codec"] in CODEC_NAMES, "§2", f"codec id {header['codec']}")
    codec = codec_from(CODEC_NAMES[header["codec"]], metadata["codec"], "§2")
    if header["major_version"] == 1 and "data_crc32c" in metadata:
        require(metadata["data_crc32c"] == "not recorded", "§1.3 step 7", f'"data_crc32c" member {metadata["data_crc32c"]!r}')
        require(header["data_crc32c"] == 0, "§1.3 step 7", 'data_crc32c not 0 beside "data_crc32c": "not recorded"')
    dictionary = index[dictionary_start:dictionary_end]
    if header["compression"]:
        member, name = metadata.get("compression"), COMPRESSION_NAMES[header["compression"]]
        require(isinstance(member, dict) and member.get("name") == name, "§1.6", f'"compression" {member!r}, header says {name}')
        require(crc32c(dictionary) == header["dictionary_crc32c"], "§1.6", "dictionary_crc32c")
        if header["compression"] == 2:
            require(dictionary[:4] == DICTIONARY_MAGIC, "§1.6", "dictionary magic")
            require(int.from_bytes(dictionary[4:8], "little") != 0, "§1.6", "Dictionary_ID 0")
    require(len(data) == header["data_size"], "§1.3 step 8", f"data file is {len(data)} bytes, header says {header['data_size']}")
    require(codec.dtype is None or header["compression"] or len(data) % codec.row_size == 0, "§1.3 step 8", "data size is not whole rows")
    offsets = struct.unpack_from(f"<{count + 1}Q", index, offsets_start)
    require(offsets[0] == 0 and offsets[-1] == len(data), "§1.3 step 9", f"offsets run from {offsets[0]} to {offsets[-1]}")
    edge = min(4096, len(data))
    require(crc32c(data[:edge] + data[len(data) - edge :]) == header["data_edge_crc32c"], "§1.3 step 10", "data_edge_crc32c")
    checksums = struct.unpack_from(f"<{count}I", index, checksums_start) if has_checksums else None
    sizes = struct.unpack_from(f"<{count}I", index, layout["sizes_start"]) if header["compression"] else None
    return Shard(index, data, header, codec, metadata, offsets, checksums, sizes, dictionary)


def frame_facts(frame: bytes) -> dict:
    """The header of the zstd frame `frame` (RFC 8878 §3.1.1.1), and where the frame ends (after its blocks
    and optional checksum, §3.1.1.2), or a §1.6 refusal."""
    rule = "§1.6"
    require(len(frame) >= 6 and frame[:4] == FRAME_MAGIC, rule, "no zstd frame magic")
    descriptor = frame[4]
    require(not descriptor & 0x08, rule, "reserved bit of the frame header descriptor")
    single = bool(descriptor & 0x20)
    position, window = 5, None
    if not single:
        exponent, mantissa = frame[5] >> 3, frame[5] & 7
        window = (1 << (10 + exponent)) + ((1 << (10 + exponent)) // 8) * mantissa
        position = 6
    id_bytes = [0, 1, 2, 4][descriptor & 3]
    size_bytes = [1 if single else 0, 2, 4, 8][descriptor >> 6]
    require(position + id_bytes + size_bytes <= len(frame), rule, "the record ends inside the frame header")
    dictionary_id = int.from_bytes(frame[position : position + id_bytes], "little")
    position += id_bytes
    content = None
    if size_bytes:
        content = int.from_bytes(frame[position : position + size_bytes], "little") + (256 if size_bytes == 2 else 0)
        position += size_bytes
    block_maximum = min(window if window is not None else content or 0, 128 << 10)
    while True:
        require(position + 3 <= len(frame), rule, "the record ends inside a block header")
        block = int.from_bytes(frame[position : position + 3], "little")
        last, kind, size = block & 1, (block >> 1) & 3, block >> 3
        require(kind != 3, rule, "a block of the reserved type")
        require(size <= block_maximum, rule, f"a block of {size} bytes over the maximum {block_maximum}")
        position += 3 + (1 if kind == 1 else size)
        if last:
            break
    position += 4 if descriptor & 0x04 else 0
    require(position <= len(frame), rule, "the record ends inside the frame")
    return {"content_size": content, "dictionary_id": dictionary_id, "window_size": window, "end": position}


def decompress_frame(frame: bytes, size: int, dictionary: bytes) -> bytes:
    """A compressed record's payload: its frame checked against §1.6 (content size declared and equal to `size`, the
    shard's dictionary or none, window, nothing after the frame), then decoded to exactly `size` bytes."""
    import zstandard  # RFC 8878 defines the decoding; only the blocks' decoding is the library's

    facts = frame_facts(frame)
    require(facts["content_size"] == size, "§1.6", f"Frame_Content_Size {facts['content_size']}, sizes[i] {size}")
    expected_id = int.from_bytes(dictionary[4:8], "little") if dictionary else 0
    require(facts["dictionary_id"] == expected_id, "§1.6", f"Dictionary_ID {facts['dictionary_id']}, expected {expected_id}")
    require(facts["window_size"] is None or facts["window_size"] <= 1 << 23, "§1.6", "window over 8 MiB")
    require(facts["end"] == len(frame), "§1.6", f"{len(frame) - facts['end']} bytes after the frame")
    options = {"dict_data": zstandard.ZstdCompressionDict(dictionary, dict_type=zstandard.DICT_TYPE_FULLDICT)} if dictionary else {}
    try:
        payload = zstandard.ZstdDecompressor(**options).decompress(frame, max_output_size=size)
    except zstandard.ZstdError as error:
        raise SpecError("§1.6", f"the frame does not decode: {error}") from None
    require(len(payload) == size, "§1.6", f"decoded {len(payload)} bytes, sizes[i] {size}")
    return payload


def read_shard(prefix: str) -> dict:
    """Open, fully verify and decode a shard: its header fields, metadata and records."""
    shard = open_shard(prefix)
    shard.verify()
    header = shard.header
    return {
        "format_version": [header["major_version"], header["minor_version"]],
        "compression": COMPRESSION_NAMES.get(header["compression"], "none"),
        "codec": header["codec"],
        "codec_params": shard.metadata["codec"],
        "metadata": shard.metadata["user"],
        "record_checksums": bool(header["flags"] & 1),
        "record_count": header["record_count"],
        "data_size": header["data_size"],
        "data_crc32c": header["data_crc32c"],
        "data_crc32c_recorded": shard.data_crc32c_recorded,
        "records": [shard.record(i) for i in range(header["record_count"])],
    }


# -- a dataset (§3) ----------------------------------------------------------------------------


@dataclass
class ListedShard:
    """A listed shard as open left it: its files and header checked against its entry, its other checks due."""

    entry: dict
    index: bytes
    data: bytes
    header: dict
    opened: Shard | None = None


@dataclass
class Dataset:
    manifest: dict
    listed: list[ListedShard]

    def __len__(self) -> int:
        return sum(entry["records"] for entry in self.manifest["shards"])

    def shard(self, k: int) -> Shard:
        """Shard k, after the checks §3.1 requires before reading from it: the rest of §1.3 (steps 7-10) and its codec
        parameters equal to the manifest's."""
        listed = self.listed[k]
        if listed.opened is None:
            shard = _open_checked(listed.index, listed.data, listed.header)
            params = self.manifest["codec"]["params"]
            require(shard.codec.params == params, "§3.1", f"shard {listed.entry['name']}: codec parameters {shard.codec.params}, manifest {params}")
            listed.opened = shard
        return listed.opened

    def record(self, g: int) -> Any:
        """Global record g: local record g - s_k of shard k (§3)."""
        require(0 <= g < len(self), "§1.3 read", f"record {g} does not exist")
        for k, listed in enumerate(self.listed):
            if g < listed.entry["records"]:
                return self.shard(k).record(g)
            g -= listed.entry["records"]

    def verify(self) -> None:
        """Full verification: every shard as before a read, its whole index against `index_crc32c`, and §1.3's."""
        for k, listed in enumerate(self.listed):
            shard = self.shard(k)
            require(crc32c(shard.index) == listed.entry["index_crc32c"], "§3.1", f"shard {listed.entry['name']}: index_crc32c")
            shard.verify()


def _is_int(value: Any, low: int, high: int) -> bool:
    return type(value) is int and low <= value < high


def parse_manifest(raw: bytes) -> dict:
    """The manifest object, checked as §3 and §3.1 say (members, types, ranges, names, its "crc32c")."""
    rule = "§3.1"
    manifest = parse_strict_json(raw, rule)
    require(isinstance(manifest, dict), rule, "the manifest is not an object")
    require(MANIFEST_MEMBERS <= set(manifest) <= MANIFEST_MEMBERS | {"crc32c"}, rule, f"members {sorted(manifest)}")
    require(manifest["format"] == "varstore-dataset", rule, f"format {manifest['format']!r}")
    require(type(manifest["version"]) is int and manifest["version"] == 1, rule, f"version {manifest['version']!r}")
    if "crc32c" in manifest:
        require(_is_int(manifest["crc32c"], 0, 1 << 32), rule, f'"crc32c" {manifest["crc32c"]!r} is not an integer in [0, 2^32)')
        from .spec_writer import canonical_json  # the spec-side §1.4 spelling; imported here, as it imports crc32c from us

        without = {name: value for name, value in manifest.items() if name != "crc32c"}
        require(manifest["crc32c"] == crc32c(canonical_json(without)), rule, "crc32c of the canonical manifest")
    codec, metadata, shards = manifest["codec"], manifest["metadata"], manifest["shards"]
    require(isinstance(codec, dict) and set(codec) == {"name", "params"}, rule, 'codec is exactly {"name", "params"}')
    require(codec["name"] in CODEC_NAMES.values(), rule, f"codec {codec['name']!r}")
    try:
        codec_from(codec["name"], codec["params"], rule)
    except SpecError as error:  # §6.3's labels: whatever is wrong in the manifest breaks §3.1, §2.1's values included
        raise SpecError(rule, str(error)) from None
    require(isinstance(metadata, dict) and isinstance(shards, list), rule, "metadata object and shards array")
    for entry in shards:
        require(isinstance(entry, dict) and set(entry) == SHARD_MEMBERS, rule, f"a shard object has exactly {sorted(SHARD_MEMBERS)}")
        name = entry["name"]
        require(isinstance(name, str) and SHARD_NAME.fullmatch(name), rule, f"shard name {name!r} is not a plain file name")
        require(".varstore-tmp-" not in name, rule, f"shard name {name!r} is a temporary file's name")
        for member in ("records", "data_size", "index_size"):
            require(_is_int(entry[member], 0, 1 << 63), rule, f"shard {name}: {member} {entry[member]!r}")
        for member in ("index_crc32c", "data_crc32c"):
            require(_is_int(entry[member], 0, 1 << 32), rule, f"shard {name}: {member} {entry[member]!r}")
    names = [entry["name"] for entry in shards]
    require(len(set(names)) == len(names), rule, "a shard name is listed twice")
    folded: dict[str, str] = {}
    for name in names:  # names are ASCII (the regex), so lower() folds exactly ASCII case
        require(name.lower() not in folded, rule, f"shard names {folded.get(name.lower())!r} and {name!r} differ only in case")
        folded[name.lower()] = name
    require(sum(entry["records"] for entry in shards) < 1 << 63, rule, "2^63 records or more")
    return manifest


def _regular_file_size(path: str) -> int:
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        raise SpecError("§3.1", f"{path} is missing") from None
    require(stat.S_ISREG(info.st_mode), "§3.1", f"{path} is not a regular file")
    return info.st_size


def open_dataset(directory: str) -> Dataset:
    """What §3.1 says a reader must check at open, and no more: the manifest, then for every listed shard its files'
    sizes, §1.3 steps 1-6 of its header and the header's agreement with its entry, and for a shard of 0 records
    also the rest of §1.3 and its codec parameters. For the others those are checked before the shard's first read
    (`Dataset.shard`), or by `Dataset.verify`."""
    path = os.path.join(directory, "manifest.json")
    require(_regular_file_size(path) <= MAX_MANIFEST_SIZE, "§3.1", "manifest over 64 MiB")
    with open(path, "rb") as file:
        manifest = parse_manifest(file.read())
    codec_id = next(number for number, name in CODEC_NAMES.items() if name == manifest["codec"]["name"])
    listed = []
    for entry in manifest["shards"]:
        name, prefix = entry["name"], os.path.join(directory, entry["name"])
        require(_regular_file_size(prefix + ".data") == entry["data_size"], "§3.1", f"{name}.data size")
        require(_regular_file_size(prefix + ".index") == entry["index_size"], "§3.1", f"{name}.index size")
        index, data = _read_files(prefix)
        header = check_header(index)
        for field, member in (("record_count", "records"), ("data_size", "data_size"), ("data_crc32c", "data_crc32c")):
            require(header[field] == entry[member], "§3.1", f"shard {name}: header {field} {header[field]}, entry {entry[member]}")
        require(header["codec"] == codec_id, "§3.1", f"shard {name}: codec id {header['codec']}, manifest {codec_id}")
        index_crc = crc32c_combine(crc32c(index[:64]), header["body_crc32c"], len(index) - 64)
        require(index_crc == entry["index_crc32c"], "§3.1", f"shard {name}: index_crc32c")
        listed.append(ListedShard(entry, index, data, header))
    dataset = Dataset(manifest, listed)
    for k, entry in enumerate(manifest["shards"]):
        if entry["records"] == 0:  # nothing is ever read from it, so no first read would check it
            dataset.shard(k)
    return dataset


def read_dataset(directory: str) -> dict:
    """Open, fully verify and decode a dataset: codec, metadata and each shard's name and records."""
    dataset = open_dataset(directory)
    dataset.verify()
    return {
        "codec": dataset.manifest["codec"]["name"],
        "codec_params": dataset.manifest["codec"]["params"],
        "metadata": dataset.manifest["metadata"],
        "shards": [
            {"name": listed.entry["name"], "records": [dataset.shard(k).record(i) for i in range(listed.entry["records"])]}
            for k, listed in enumerate(dataset.listed)
        ],
    }


# -- the vectors' JSON notation (§6) ------------------------------------------------------------


def _number_notation(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return {"$float": "NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"}
    return value


def notation(record: Any) -> Any:
    """A decoded record in the notation of §6."""
    if isinstance(record, bytes):
        return {"$bytes": record.hex()}
    if isinstance(record, np.ndarray):
        values = record.reshape(-1).tolist()
        if record.dtype.kind == "c":
            values = [[_number_notation(value.real), _number_notation(value.imag)] for value in values]
        return {"$array": {"dtype": record.dtype.str, "shape": list(record.shape), "values": list(map(_number_notation, values))}}
    if isinstance(record, dict):
        if all(type(key) is str and not key.startswith("$") for key in record):
            return {key: notation(value) for key, value in record.items()}
        return {"$map": [[key, notation(value)] for key, value in record.items()]}
    if isinstance(record, list):
        return [notation(value) for value in record]
    return _number_notation(record)

"""A writer of varstore shards from a vector description, written from spec/FORMAT.md alone.

It imports nothing from varstore and no msgpack or JSON encoder: the notation decoder (§6), the canonical
JSON of the metadata (§1.4) and the canonical MessagePack of records (§2.2) are written here from the
spec's words, so a vector it reproduces byte for byte is an expected value independent of the code under
test. Float digits come from Python's correctly rounded ``%e`` formatting, searched for §1.4's shortest
round-trip string (not from ``repr``, whose algorithm is the one varstore uses); CRC32C is the spec-side one of
spec_reader.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import Any

from .spec_reader import crc32c

CODEC_IDS = {"bytes": 0, "str": 1, "ndarray": 2, "msgpack": 3}
FORMAT_VERSION = (1, 1)
DATA_CRC_UNRECORDED_VERSION = (1, 3)  # §1.2: a shard whose metadata says its data_crc32c is not recorded
MAGIC = b"\x89VSI\r\n\x1a\n"

# struct letters of each §2.1 dtype (complex: the letter of each of its two parts) and its itemsize.
_ELEMENT_FORMATS = {
    "|b1": ("?", 1), "|i1": ("b", 1), "|u1": ("B", 1), "<i2": ("h", 2), "<u2": ("H", 2), "<i4": ("i", 4),
    "<u4": ("I", 4), "<i8": ("q", 8), "<u8": ("Q", 8), "<f2": ("e", 2), "<f4": ("f", 4), "<f8": ("d", 8),
    "<c8": ("f", 8), "<c16": ("d", 16),
}
# The quiet NaN of each float width (§6: the notation's "NaN"), as an unsigned integer of that width.
_QUIET_NAN_BITS = {"e": ("H", 0x7E00), "f": ("I", 0x7FC00000), "d": ("Q", 0x7FF8000000000000)}
_NON_FINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


class NotationError(ValueError):
    """A description that the §6 notation does not allow."""


@dataclass(frozen=True)
class Map:
    """A MessagePack map: its entries in stored order (keys str or int)."""

    entries: tuple[tuple[Any, Any], ...]


@dataclass(frozen=True)
class Array:
    """An n-dimensional array: dtype string, shape and its elements' bytes in C order (little-endian)."""

    dtype: str
    shape: tuple[int, ...]
    body: bytes


# -- notation -> values ---------------------------------------------------------------------------------


def from_notation(value: Any) -> Any:
    """The record a parsed JSON value stands for in the §6 notation (Map, Array, bytes and Python scalars)."""
    if value is None or isinstance(value, (bool, str, float)):
        return value
    if isinstance(value, int):
        if not -(1 << 63) <= value < 1 << 64:
            raise NotationError(f"integer {value} is outside [-2**63, 2**64)")
        return value
    if isinstance(value, list):
        return [from_notation(item) for item in value]
    if not any(name.startswith("$") for name in value):
        return Map(tuple((name, from_notation(item)) for name, item in value.items()))
    if len(value) != 1:
        raise NotationError(f"an object with a $ member must have exactly one member: {sorted(value)}")
    ((name, body),) = value.items()
    if name == "$bytes":
        if not isinstance(body, str) or len(body) % 2 or body.strip("0123456789abcdef"):
            raise NotationError(f"$bytes is lowercase hex: {body!r}")
        return bytes.fromhex(body)
    if name == "$float":
        return _non_finite(body)
    if name == "$map":
        entries = tuple(_map_entry(entry) for entry in body)
        keys = [(type(key), key) for key, _ in entries]
        if len(set(keys)) != len(keys) or all(isinstance(key, str) and not key.startswith("$") for key, _ in entries):
            raise NotationError(f"a $map has no key twice and a key that is an integer or starts with $: {body!r}")
        return Map(entries)
    if name == "$array":
        if set(body) != {"dtype", "shape", "values"}:
            raise NotationError(f"$array has exactly dtype, shape and values: {sorted(body)}")
        return Array(body["dtype"], tuple(body["shape"]), _elements(body["dtype"], body["shape"], body["values"]))
    raise NotationError(f"unknown notation member {name!r}")


def _non_finite(body: Any) -> float:
    if body not in _NON_FINITE:
        raise NotationError(f'$float is "NaN", "Infinity" or "-Infinity": {body!r}')
    return _NON_FINITE[body]


def _map_entry(entry: Any) -> tuple[Any, Any]:
    key, item = entry
    if not isinstance(key, (str, int)) or isinstance(key, bool):
        raise NotationError(f"a $map key is a str or an integer: {key!r}")
    return from_notation(key), from_notation(item)


def _elements(dtype: str, shape: list[int], values: list[Any]) -> bytes:
    letter, _ = _ELEMENT_FORMATS[dtype]
    if len(values) != math.prod(shape):
        raise NotationError(f"$array of shape {shape} needs {math.prod(shape)} values, has {len(values)}")
    parts = [pair for value in values for pair in value] if dtype[1] == "c" else values
    return b"".join(_element(letter, value) for value in parts)


def _element(letter: str, value: Any) -> bytes:
    if letter == "?":
        if not isinstance(value, bool):
            raise NotationError(f"|b1 values are true or false: {value!r}")
        return bytes([value])  # §2.2: a |b1 element is the byte 0 or 1
    floating = letter in _QUIET_NAN_BITS
    if floating and isinstance(value, dict):
        value = _non_finite(value.get("$float"))
    elif type(value) is not (float if floating else int):  # §6.1: `1` is no float value, `1.0` no integer one
        raise NotationError(f"a value of struct format {letter!r} is a JSON {'float' if floating else 'integer'}: {value!r}")
    if floating and math.isnan(value):
        bits_letter, bits = _QUIET_NAN_BITS[letter]
        return struct.pack("<" + bits_letter, bits)
    packed = struct.pack("<" + letter, value)
    if struct.unpack("<" + letter, packed)[0] != value:  # the notation spells stored values exactly
        raise NotationError(f"{value!r} is not exactly a value of struct format {letter!r}")
    return packed


# -- canonical JSON (§1.4) ------------------------------------------------------------------------------

_JSON_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}


def canonical_json(value: Any) -> bytes:
    """The canonical JSON bytes of a JSON value: UTF-8, no white space, members sorted by code point."""
    return _json_text(value).encode("utf-8")


def _json_text(value: Any) -> str:
    if value is None:
        return "null"
    if value is True or value is False:
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return json_float(value)
    if isinstance(value, str):
        return _json_string(value)
    if isinstance(value, list):
        return "[" + ",".join(map(_json_text, value)) + "]"
    # Python compares str by code point, which is the §1.4 order (not UTF-16 code units).
    return "{" + ",".join(_json_string(name) + ":" + _json_text(value[name]) for name in sorted(value)) + "}"


def _json_string(text: str) -> str:
    escaped = (_JSON_ESCAPES.get(char) or (f"\\u{ord(char):04x}" if char < " " else char) for char in text)
    return '"' + "".join(escaped) + '"'


def json_float(value: float) -> str:
    """§1.4's spelling of a finite float: the shortest round-trip digits, positional for 1e-4 <= |x| < 1e16,
    else D[.DDD]e±XX. Zero is ``0.0`` or ``-0.0``."""
    if not math.isfinite(value):
        raise ValueError(f"canonical JSON has no {value}")
    sign = "-" if math.copysign(1.0, value) < 0 else ""
    if value == 0:
        return sign + "0.0"
    digits, exponent = _shortest_digits(abs(value))
    if -4 <= exponent < 16:
        if exponent >= 0:
            whole, fraction = digits[: exponent + 1].ljust(exponent + 1, "0"), digits[exponent + 1 :]
        else:
            whole, fraction = "0", "0" * (-exponent - 1) + digits
        return f"{sign}{whole}.{fraction or '0'}"
    mantissa = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
    return f"{sign}{mantissa}e{'-' if exponent < 0 else '+'}{abs(exponent):02d}"


def _shortest_digits(value: float) -> tuple[str, int]:
    """(significant digits without trailing zeros, decimal exponent of the first), value = D.DDD × 10^e: §1.4's
    fewest digits that read back to `value`, at that length the nearest to its exact value, a tie to the even
    digit. ``%e`` formatting rounds the exact binary value correctly, half to even, so the first precision whose
    string reads back is the answer."""
    for precision in range(1, 18):
        text = f"{value:.{precision - 1}e}"
        if float(text) == value:
            mantissa, _, exponent = text.partition("e")
            return mantissa.replace(".", "").rstrip("0"), int(exponent)
    raise AssertionError(f"{value!r} needs more than 17 digits")  # every float64 reads back from 17


# -- canonical MessagePack (§2.2) -----------------------------------------------------------------------


def msgpack_bytes(value: Any) -> bytes:
    """The canonical MessagePack encoding of a record: smallest headers, floats as float 64, map order kept."""
    out = bytearray()
    _pack(value, out)
    return bytes(out)


def _pack(value: Any, out: bytearray) -> None:
    if value is None:
        out += b"\xc0"
    elif value is True or value is False:
        out += b"\xc3" if value else b"\xc2"
    elif isinstance(value, int):
        out += _int_bytes(value)
    elif isinstance(value, float):
        out += b"\xcb" + (struct.pack(">Q", 0x7FF8000000000000) if math.isnan(value) else struct.pack(">d", value))
    elif isinstance(value, str):
        raw = value.encode("utf-8")
        out += _header(len(raw), fix=(0xA0, 31), sized=(0xD9, 0xDA, 0xDB)) + raw
    elif isinstance(value, bytes):
        out += _header(len(value), fix=None, sized=(0xC4, 0xC5, 0xC6)) + value
    elif isinstance(value, list):
        out += _header(len(value), fix=(0x90, 15), sized=(None, 0xDC, 0xDD))
        for item in value:
            _pack(item, out)
    elif isinstance(value, Map):
        out += _header(len(value.entries), fix=(0x80, 15), sized=(None, 0xDE, 0xDF))
        for key, item in value.entries:
            _pack(key, out)
            _pack(item, out)
    elif isinstance(value, Array):
        out += _extension(1, _array_extension_data(value))
    else:
        raise TypeError(f"no MessagePack form for {type(value).__name__}")


def _int_bytes(value: int) -> bytes:
    if 0 <= value <= 0x7F:
        return bytes([value])  # positive fixint
    if -32 <= value < 0:
        return bytes([value & 0xFF])  # negative fixint
    if value > 0:
        for code, letter, top in ((0xCC, "B", 0xFF), (0xCD, "H", 0xFFFF), (0xCE, "I", 0xFFFFFFFF), (0xCF, "Q", (1 << 64) - 1)):
            if value <= top:
                return bytes([code]) + struct.pack(">" + letter, value)
    for code, letter, bottom in ((0xD0, "b", -(1 << 7)), (0xD1, "h", -(1 << 15)), (0xD2, "i", -(1 << 31)), (0xD3, "q", -(1 << 63))):
        if value >= bottom:
            return bytes([code]) + struct.pack(">" + letter, value)
    raise ValueError(f"integer {value} has no MessagePack form")


def _header(length: int, *, fix: tuple[int, int] | None, sized: tuple[int | None, int, int]) -> bytes:
    """The smallest header for a str, bin, array or map of `length`: fix form, then 8-, 16-, 32-bit length."""
    if fix is not None and length <= fix[1]:
        return bytes([fix[0] | length])
    for code, letter, top in zip(sized, "BHI", (0xFF, 0xFFFF, 0xFFFFFFFF)):
        if code is not None and length <= top:
            return bytes([code]) + struct.pack(">" + letter, length)
    raise ValueError(f"length {length} has no MessagePack form")


def _extension(type_code: int, data: bytes) -> bytes:
    fixext = {1: 0xD4, 2: 0xD5, 4: 0xD6, 8: 0xD7, 16: 0xD8}
    if len(data) in fixext:
        return bytes([fixext[len(data)], type_code]) + data
    return _header(len(data), fix=None, sized=(0xC7, 0xC8, 0xC9)) + bytes([type_code]) + data


def _array_extension_data(array: Array) -> bytes:
    name = array.dtype.encode("ascii")
    shape = struct.pack(f"<{len(array.shape)}Q", *array.shape)
    return bytes([len(name)]) + name + bytes([len(array.shape)]) + shape + array.body


# -- a shard (§1) ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ShardBytes:
    index: bytes
    data: bytes


def record_payload(codec: str, params: dict[str, Any], record: Any) -> bytes:
    """The payload of one record (already decoded from the notation) under `codec` (§2)."""
    if codec == "bytes" and isinstance(record, bytes):
        return record
    if codec == "str" and isinstance(record, str):
        return record.encode("utf-8")
    if codec == "ndarray" and isinstance(record, Array):
        if record.dtype != params["dtype"] or list(record.shape[1:]) != params["shape"] or len(record.shape) != 1 + len(params["shape"]):
            raise NotationError(f"array {record.dtype} {record.shape} is not a record of {params}")
        return record.body
    if codec == "msgpack":
        return msgpack_bytes(record)
    raise NotationError(f"{type(record).__name__} is not a {codec} record")


def write_shard(description: dict[str, Any]) -> ShardBytes:
    """The index and data files of the shard a description describes, built from the spec alone."""
    codec, params = description["codec"], description["codec_params"]
    payloads = [record_payload(codec, params, from_notation(record)) for record in description["records"]]
    data = b"".join(payloads)
    recorded = description.get("data_crc32c_recorded", True)
    unrecorded = {} if recorded else {"data_crc32c": "not recorded"}
    metadata = canonical_json({"codec": params, "user": description["metadata"], **unrecorded})
    offsets = [0]
    for payload in payloads:
        offsets.append(offsets[-1] + len(payload))
    body = metadata + bytes(-(64 + len(metadata)) % 8) + struct.pack(f"<{len(offsets)}Q", *offsets)
    flags = 1 if description["record_checksums"] else 0
    if flags:
        body += struct.pack(f"<{len(payloads)}I", *map(crc32c, payloads))
    edge = crc32c(data[:4096] + data[len(data) - min(4096, len(data)) :])
    header = MAGIC + struct.pack(
        "<HHBBHQQQIII8s", *(FORMAT_VERSION if recorded else DATA_CRC_UNRECORDED_VERSION), CODEC_IDS[codec], 0, flags,
        len(payloads), len(data), len(metadata), crc32c(data) if recorded else 0, edge, crc32c(body), bytes(8),
    )
    return ShardBytes(header + struct.pack("<I", crc32c(header)) + body, data)


def header_facts(shard: ShardBytes) -> dict[str, Any]:
    """The header fields a description states, read from a shard's index bytes."""
    major, minor = struct.unpack_from("<HH", shard.index, 8)
    record_count, data_size = struct.unpack_from("<QQ", shard.index, 16)
    (data_crc32c,) = struct.unpack_from("<I", shard.index, 40)
    return {"format_version": [major, minor], "record_count": record_count, "data_size": data_size, "data_crc32c": data_crc32c}

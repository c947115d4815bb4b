"""The MessagePack bytes varstore writes (spec §2.2 "Canonical encoding") and what its readers accept.

Expected bytes are spelled here by hand from the MessagePack specification (first byte, then a big-endian
length or value), never produced by msgpack-python, so a change of encoder or of its options shows. Readers
accept every MessagePack form: a non-minimal header is not damage."""

from __future__ import annotations

import struct

import numpy as np
import pytest

import varstore
from varstore.format.codecs import MsgpackCodec

from . import spec_reader
from .test_untrusted_input import msgpack_shard


def be(value: int, size: int) -> bytes:
    return value.to_bytes(size, "big")


def ext1(data: bytes) -> bytes:
    """Extension type 1 holding `data`: fixext 1/2/4/8/16 for those exact lengths, else ext 8/16/32."""
    fixext = {1: 0xD4, 2: 0xD5, 4: 0xD6, 8: 0xD7, 16: 0xD8}
    if len(data) in fixext:
        return bytes([fixext[len(data)], 1]) + data
    for first, size in ((0xC7, 1), (0xC8, 2), (0xC9, 4)):
        if len(data) < 1 << (8 * size):
            return bytes([first]) + be(len(data), size) + b"\x01" + data
    raise AssertionError(len(data))


def array_data(dtype: str, shape: tuple[int, ...], body: bytes) -> bytes:
    """Extension type 1's data (spec §2.2 table): dtype length and string, ndim, u64 LE shape, elements."""
    return bytes([len(dtype)]) + dtype.encode() + bytes([len(shape)]) + b"".join(d.to_bytes(8, "little") for d in shape) + body


# (record, the bytes a writer must produce), boundary values of every header family.
CANONICAL = {
    "0": (0, b"\x00"), "127": (127, b"\x7f"), "128": (128, b"\xcc\x80"), "255": (255, b"\xcc\xff"),
    "256": (256, b"\xcd\x01\x00"), "65535": (65535, b"\xcd\xff\xff"), "65536": (65536, b"\xce\x00\x01\x00\x00"),
    "2**32-1": (2**32 - 1, b"\xce\xff\xff\xff\xff"), "2**32": (2**32, b"\xcf\x00\x00\x00\x01\x00\x00\x00\x00"),
    "2**63-1": (2**63 - 1, b"\xcf\x7f" + b"\xff" * 7), "2**63": (2**63, b"\xcf\x80" + bytes(7)),
    "2**64-1": (2**64 - 1, b"\xcf" + b"\xff" * 8),
    "-1": (-1, b"\xff"), "-32": (-32, b"\xe0"), "-33": (-33, b"\xd0\xdf"), "-128": (-128, b"\xd0\x80"),
    "-129": (-129, b"\xd1\xff\x7f"), "-32768": (-32768, b"\xd1\x80\x00"), "-32769": (-32769, b"\xd2\xff\xff\x7f\xff"),
    "-2**31": (-(2**31), b"\xd2\x80\x00\x00\x00"), "-2**31-1": (-(2**31) - 1, b"\xd3\xff\xff\xff\xff\x7f\xff\xff\xff"),
    "-2**63": (-(2**63), b"\xd3\x80" + bytes(7)),
    "nil": (None, b"\xc0"), "false": (False, b"\xc2"), "true": (True, b"\xc3"),
    "1.0": (1.0, b"\xcb\x3f\xf0" + bytes(6)), "1.5": (1.5, b"\xcb\x3f\xf8" + bytes(6)),
    "-0.0": (-0.0, b"\xcb\x80" + bytes(7)), "0.5, exact in float 32": (0.5, b"\xcb\x3f\xe0" + bytes(6)),
    "str 0": ("", b"\xa0"), "str 31": ("a" * 31, b"\xbf" + b"a" * 31), "str 32": ("a" * 32, b"\xd9\x20" + b"a" * 32),
    "str 255": ("a" * 255, b"\xd9\xff" + b"a" * 255), "str 256": ("a" * 256, b"\xda\x01\x00" + b"a" * 256),
    "str 65535": ("a" * 65535, b"\xda\xff\xff" + b"a" * 65535),
    "str 65536": ("a" * 65536, b"\xdb\x00\x01\x00\x00" + b"a" * 65536),
    "str of 2-byte characters": ("é" * 16, b"\xd9\x20" + "é".encode() * 16),
    "bin 0": (b"", b"\xc4\x00"), "bin 255": (b"b" * 255, b"\xc4\xff" + b"b" * 255),
    "bin 256": (b"b" * 256, b"\xc5\x01\x00" + b"b" * 256), "bin 65535": (b"b" * 65535, b"\xc5\xff\xff" + b"b" * 65535),
    "bin 65536": (b"b" * 65536, b"\xc6\x00\x01\x00\x00" + b"b" * 65536),
    "array 0": ([], b"\x90"), "array 15": ([0] * 15, b"\x9f" + bytes(15)), "array 16": ([0] * 16, b"\xdc\x00\x10" + bytes(16)),
    "array 65535": ([0] * 65535, b"\xdc\xff\xff" + bytes(65535)),
    "array 65536": ([0] * 65536, b"\xdd\x00\x01\x00\x00" + bytes(65536)),
    "map 0": ({}, b"\x80"),
    "map 15": ({index: 0 for index in range(15)}, b"\x8f" + b"".join(bytes([index, 0]) for index in range(15))),
    "map 16": ({index: 0 for index in range(16)}, b"\xde\x00\x10" + b"".join(bytes([index, 0]) for index in range(16))),
    "map 65536": ({index: 0.5 for index in range(65536)}, b"\xdf\x00\x01\x00\x00" + b"".join(  # floats: within §2.2's memory
        (bytes([index]) if index < 128 else b"\xcc" + be(index, 1) if index < 256 else b"\xcd" + be(index, 2)) + b"\xcb" + struct.pack(">d", 0.5)
        for index in range(65536))),
    "map in insertion order": ({"b": 1, "a": 2, 1: 3}, b"\x83\xa1b\x01\xa1a\x02\x01\x03"),
    "fixext 16": (np.zeros(3, np.uint8), b"\xd8\x01" + array_data("|u1", (3,), bytes(3))),
    "ext 8 of 17 bytes": (np.zeros(4, np.uint8), b"\xc7\x11\x01" + array_data("|u1", (4,), bytes(4))),
    "ext 8 of 255 bytes": (np.zeros(242, np.uint8), b"\xc7\xff\x01" + array_data("|u1", (242,), bytes(242))),
    "ext 16 of 256 bytes": (np.zeros(243, np.uint8), b"\xc8\x01\x00\x01" + array_data("|u1", (243,), bytes(243))),
    "ext 16 of 65535 bytes": (np.zeros(65522, np.uint8), b"\xc8\xff\xff\x01" + array_data("|u1", (65522,), bytes(65522))),
    "ext 32 of 65536 bytes": (np.zeros(65523, np.uint8), b"\xc9\x00\x01\x00\x00\x01" + array_data("|u1", (65523,), bytes(65523))),
    "0-d bool": (np.bool_(True), b"\xc7\x06\x01" + array_data("|b1", (), b"\x01")),
    "nested": ({"x": [1, {"y": b"z"}]}, b"\x81\xa1x\x92\x01\x81\xa1y\xc4\x01z"),
}


@pytest.mark.parametrize("name", list(CANONICAL))
def test_msgpack_writer_uses_the_smallest_header_float_64_and_fixext_forms(name):
    record, expected = CANONICAL[name]
    assert bytes(MsgpackCodec().encode(record)) == expected


def test_a_shards_data_file_holds_exactly_the_canonical_bytes(tmp_path):
    names = ["128", "-33", "2**63", "1.5", "str 32", "bin 256", "map in insertion order", "fixext 16", "ext 8 of 17 bytes"]
    with varstore.Writer(tmp_path / "docs", codec="msgpack") as writer:
        writer.extend(CANONICAL[name][0] for name in names)
    assert (tmp_path / "docs.data").read_bytes() == b"".join(CANONICAL[name][1] for name in names)


# -- numpy scalars: float64, str_ and bytes_ are Python float, str and bytes; every other one is a 0-d array --

PYTHON_LIKE_SCALARS = [
    (np.float64(1.5), b"\xcb\x3f\xf8" + bytes(6), 1.5),
    (np.str_("ab"), b"\xa2ab", "ab"),
    (np.bytes_(b"ab"), b"\xc4\x02ab", b"ab"),
]
ARRAY_SCALARS = [
    np.bool_(True), np.bool_(False), np.int8(-2), np.uint8(200), np.int16(-300), np.uint16(60000), np.int32(-(2**31)),
    np.uint32(2**32 - 1), np.int64(-(2**63)), np.uint64(2**64 - 1), np.float16(0.5), np.float32(-1.25),
    np.complex64(1 - 2j), np.complex128(complex(3.5, -0.0)),
]


@pytest.mark.parametrize(("scalar", "stored", "read"), PYTHON_LIKE_SCALARS, ids=lambda v: type(v).__name__)
def test_numpy_float64_str_and_bytes_scalars_are_stored_and_read_as_float_str_and_bytes(tmp_path, scalar, stored, read):
    assert bytes(MsgpackCodec().encode(scalar)) == stored
    with varstore.Writer(tmp_path / "docs", codec="msgpack") as writer:
        writer.append(scalar)
    with varstore.open(tmp_path / "docs") as reader:
        assert type(reader[0]) is type(read) and reader[0] == read


@pytest.mark.parametrize("scalar", ARRAY_SCALARS, ids=lambda value: f"{type(value).__name__}({value})")
def test_every_other_numpy_scalar_is_stored_and_read_as_a_0_d_array(tmp_path, scalar):
    little_endian = np.dtype(type(scalar)).newbyteorder("<")
    body = np.array(scalar, little_endian).tobytes()
    assert bytes(MsgpackCodec().encode(scalar)) == ext1(array_data(little_endian.str, (), body))
    with varstore.Writer(tmp_path / "docs", codec="msgpack") as writer:
        writer.append({"value": scalar})
    with varstore.open(tmp_path / "docs") as reader:
        read = reader[0]["value"]
    assert isinstance(read, np.ndarray) and read.shape == () and read.dtype == little_endian and not read.flags.writeable
    assert read.tobytes() == body


@pytest.mark.parametrize("scalar", [np.longdouble(1), np.datetime64("2020-01-01"), np.timedelta64(1, "s"), np.void(b"ab")],
                         ids=lambda value: type(value).__name__)
def test_numpy_scalars_of_dtypes_the_format_lacks_are_refused(tmp_path, scalar):
    with pytest.raises(varstore.RecordTypeError):
        varstore.Writer(tmp_path / "docs", codec="msgpack").append({"value": scalar})


# -- readers accept every form --------------------------------------------------------------------------

NON_CANONICAL = {
    "float 32": (b"\xca\x3f\xc0\x00\x00", 1.5),
    "uint 8 for 1": (b"\xcc\x01", 1),
    "uint 64 for 1": (b"\xcf" + be(1, 8), 1),
    "int 8 for 5": (b"\xd0\x05", 5),
    "int 64 for -1": (b"\xd3" + b"\xff" * 8, -1),
    "uint 16 for 128": (b"\xcd\x00\x80", 128),
    "str 8 for a 3-byte string": (b"\xd9\x03abc", "abc"),
    "str 32 for a 1-byte string": (b"\xdb\x00\x00\x00\x01a", "a"),
    "bin 32 for 2 bytes": (b"\xc6\x00\x00\x00\x02ab", b"ab"),
    "array 16 of one": (b"\xdc\x00\x01\x01", [1]),
    "map 32 with a str 8 key": (b"\xdf\x00\x00\x00\x01\xd9\x01k\xcc\x07", {"k": 7}),
    "map key as uint 16": (b"\x81\xcd\x00\x05\xc0", {5: None}),
}


@pytest.mark.parametrize("name", list(NON_CANONICAL))
def test_reader_accepts_a_non_canonical_form_and_returns_the_same_value(tmp_path, name):
    payload, value = NON_CANONICAL[name]
    msgpack_shard(tmp_path / "docs", [payload, b"\x91" + payload])
    with varstore.open(tmp_path / "docs") as reader:
        reader.verify()
        assert reader[0] == value and type(reader[0]) is type(value)
        assert reader.get_batch([1]) == [[value]]
    assert spec_reader.read_shard(str(tmp_path / "docs"))["records"][0] == value


def test_reader_accepts_an_array_extension_in_a_non_minimal_ext_form(tmp_path):
    data = array_data("<f4", (2,), struct.pack("<2f", 1.0, -2.0))  # 21 bytes: ext 8 is canonical, ext 16 and 32 are not
    forms = [b"\xc7\x15\x01" + data, b"\xc8\x00\x15\x01" + data, b"\xc9\x00\x00\x00\x15\x01" + data]
    sixteen = array_data("|u1", (3,), b"\x01\x02\x03")  # 16 bytes: fixext 16 is canonical, ext 8 is not
    msgpack_shard(tmp_path / "docs", [*forms, b"\xc7\x10\x01" + sixteen])
    with varstore.open(tmp_path / "docs") as reader:
        reader.verify()
        for index in range(3):
            assert reader[index].dtype == np.float32 and reader[index].tolist() == [1.0, -2.0]
        assert reader[3].dtype == np.uint8 and reader[3].tolist() == [1, 2, 3]


# -- the §2.2 rules a record must keep, whatever its form -------------------------------------------------


def array_record(dtype: str, shape: tuple[int, ...], body: bytes = b"") -> bytes:
    return ext1(array_data(dtype, shape, body))


DAMAGED = {
    "str not UTF-8": b"\xa1\xff",
    "str holding an encoded surrogate": b"\xa3\xed\xa0\x80",
    "map key not UTF-8": b"\x81\xa1\xff\x01",
    "false key": b"\x81\xc2\x01",
    "extension key": b"\x81" + array_record("|u1", (1,), b"\x01") + b"\x01",
    '"a" as fixstr and str 16': b"\x82\xa1a\x01\xda\x00\x01a\x02",
    '"a" as str 32 and str 8': b"\x82\xdb\x00\x00\x00\x01a\x01\xd9\x01a\x02",
    "1 as int 64 and uint 64": b"\x82\xd3" + be(1, 8) + b"\x01\xcf" + be(1, 8) + b"\x02",
    "-1 as negative fixint and int 8": b"\x82\xff\x01\xd0\xff\x02",
    "maps nested 513 deep": b"\x81\x00" * 513 + b"\xc0",
    "empty array, a leading dimension of 2**16 + 1": array_record("<f4", (2**16 + 1, 0)),
    "empty array, a second leading dimension of 2**16 + 1": array_record("<f4", (3, 2**16 + 1, 0)),
    "empty array, non-zero dimensions multiplying to 2**24 + 1": array_record("<f4", (0, 2**24 + 1)),
    "empty array, 2**16 x 257 non-zero": array_record("|u1", (2**16, 0, 257)),
    "array, a dimension of 2**64 - 1 over 4 bytes": array_record("|u1", (2**64 - 1, 1), bytes(4)),
}
WITHIN_BOUNDS = {
    "maps nested 512 deep": (b"\x81\x00" * 511 + b"\x80", None),
    "empty array, a leading dimension of 2**16": (array_record("<f4", (2**16, 0)), (2**16, 0)),
    "empty array, 2**16 x 256 non-zero": (array_record("|u1", (2**16, 0, 256)), (2**16, 0, 256)),
    "empty array, non-zero dimensions multiplying to 2**24": (array_record("<f4", (0, 2**12, 2**12)), (0, 2**12, 2**12)),
}


@pytest.mark.parametrize("name", list(DAMAGED))
def test_record_breaking_a_msgpack_rule_in_any_form_is_damaged(tmp_path, name):
    msgpack_shard(tmp_path / "docs", [b"\xc0", DAMAGED[name]])
    with varstore.open(tmp_path / "docs") as reader:
        assert reader[0] is None
        with pytest.raises(varstore.CorruptRecordError) as caught:
            reader[1]
        assert caught.value.records == [1]
        with pytest.raises(varstore.CorruptRecordError) as caught:
            reader.verify()
        assert caught.value.records == [1]
    with pytest.raises(spec_reader.SpecError):
        spec_reader.read_shard(str(tmp_path / "docs"))


@pytest.mark.parametrize("name", list(WITHIN_BOUNDS))
def test_record_at_a_msgpack_bound_reads(tmp_path, name):
    payload, shape = WITHIN_BOUNDS[name]
    msgpack_shard(tmp_path / "docs", [payload])
    with varstore.open(tmp_path / "docs") as reader:
        reader.verify()
        if shape is not None:
            assert reader[0].shape == shape
    spec_reader.read_shard(str(tmp_path / "docs"))

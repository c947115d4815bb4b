"""The C extension's msgpack packing (`speedups.msgpack_pack`, `msgpack_pack_each`) writes the bytes the Python path
writes, or declines: records of every kind a msgpack shard takes, plain or not, packed both ways and compared;
ordinary records are never declined (so the writer's fast path is taken); and a shard of structured records is the
same file with and without the extension. Skipped where the extension was not built."""

from __future__ import annotations

import enum
import os
import tempfile

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import varstore
from varstore._native import speedups
from varstore.errors import RecordTypeError
from varstore.format.codecs import _PACKED_DTYPES as PACKED_DTYPES
from varstore.format.codecs import ALLOWED_DTYPES, MsgpackCodec

from .test_speedups import extension_disabled, shard_bytes

pytestmark = pytest.mark.skipif(speedups is None, reason="varstore._speedups was not built (or VARSTORE_NO_EXTENSION is set)")

CODEC = MsgpackCodec()


class Colour(enum.IntEnum):
    RED = 7


def python_outcome(record: object) -> bytes | str:
    """What the Python path alone makes of `record`: its payload, or the refusal's class name."""
    try:
        return CODEC._encode_in_python(record)
    except RecordTypeError as error:
        return type(error).__name__


def array_of(dtype: str, shape: tuple[int, ...], seed: int) -> np.ndarray:
    size = int(np.prod(shape)) * np.dtype(dtype).itemsize
    return np.frombuffer(np.random.default_rng(seed).bytes(size), dtype).reshape(shape).copy()


# Every integer width and sign msgpack has, and past its range; every str and bin length class up to 2**16.
edge_integers = st.sampled_from([0, 1, 31, 32, 127, 128, 255, 256, 65535, 65536, 2**31 - 1, 2**31, 2**32 - 1, 2**32,
                                 2**63 - 1, 2**63, 2**64 - 1, 2**64, -1, -31, -32, -33, -127, -128, -129, -32768, -32769,
                                 -(2**31), -(2**31) - 1, -(2**63), -(2**63) - 1])
lengths = st.sampled_from([0, 1, 2, 15, 16, 31, 32, 255, 256, 65535, 65536])
plain_dtypes = st.sampled_from([name for name in ALLOWED_DTYPES if name != "|b1"])
shapes = st.lists(st.integers(1, 4), max_size=3).map(tuple)
plain_arrays = st.builds(array_of, plain_dtypes, shapes, st.integers(0, 2**16))
# Arrays the Python path packs or refuses on its own: bools (checked byte by byte), empty ones, big-endian,
# strided or Fortran-ordered ones, other instances of an allowed dtype, and numpy scalars.
other_arrays = st.one_of(
    st.builds(lambda n: np.arange(n) % 2 == 0, st.integers(0, 9)),
    st.builds(lambda n: np.arange(n, dtype=np.uint8).view(np.bool_), st.integers(2, 9)),
    st.builds(lambda shape: np.zeros(shape, np.float32), st.sampled_from([(0,), (3, 0), (0, 70000)])),
    st.builds(lambda a: a.astype(a.dtype.newbyteorder(">")), plain_arrays),
    st.builds(lambda a: a.reshape(-1)[::2], plain_arrays),
    st.builds(lambda a: np.asfortranarray(a.reshape(2, -1)), plain_arrays.filter(lambda a: a.size % 2 == 0 and a.size > 2)),
    st.builds(lambda a: a.astype(np.longlong), st.builds(array_of, st.just("<i8"), shapes, st.integers(0, 9))),
    st.builds(lambda n: np.float32(n), st.integers(-1000, 1000)),
    st.builds(lambda n: np.int64(n), st.integers(-(2**63), 2**63 - 1)),
    st.builds(lambda n: np.float64(n), st.floats()),
    st.builds(lambda a: a.reshape((1,) * 32), st.builds(array_of, st.just("<u1"), st.just((1,)), st.integers(0, 9))),
)
plain_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), edge_integers, st.floats(allow_nan=True),
    st.text(max_size=40), lengths.map(lambda n: "é" * (n // 2) + "a" * (n % 2)), lengths.map(lambda n: "x" * n),
    st.binary(max_size=40), lengths.map(bytes), plain_arrays,
)
other_scalars = st.one_of(
    other_arrays, st.just(Colour.RED), st.just(bytearray(b"ab")), st.just(memoryview(b"abcd")[::2]),
    st.just("\ud800"), st.just(1j), st.just(object()), st.just({1, 2}),
)
keys = st.one_of(st.text(max_size=8), st.integers(-(2**63), 2**64 - 1))


def records_of(leaves: st.SearchStrategy[object], key_strategy: st.SearchStrategy[object]) -> st.SearchStrategy[object]:
    return st.recursive(
        leaves,
        lambda children: st.one_of(st.lists(children, max_size=5), st.lists(children, max_size=5).map(tuple),
                                   st.dictionaries(key_strategy, children, max_size=5)),
        max_leaves=25,
    )


plain_records = records_of(plain_scalars, keys)
any_records = records_of(st.one_of(plain_scalars, other_scalars),
                         st.one_of(keys, st.sampled_from([True, np.int16(3), b"k", 1.5, (1, 2)])))


@given(record=any_records)
def test_packed_record_is_byte_for_byte_the_python_paths(record):
    packed = speedups.msgpack_pack(record, np.ndarray, PACKED_DTYPES)
    if packed is not None:
        assert packed == python_outcome(record)


@given(record=plain_records)
def test_plain_records_are_packed_in_c_not_declined(record):
    expected = python_outcome(record)
    packed = speedups.msgpack_pack(record, np.ndarray, PACKED_DTYPES)
    if isinstance(expected, bytes):  # an integer past 64 bits refuses, and is declined
        assert packed == expected


@given(records=st.lists(any_records, max_size=8))
def test_encode_many_packs_each_record_as_encode_does_and_refuses_the_same(records):
    expected = [python_outcome(record) for record in records]
    if all(isinstance(outcome, bytes) for outcome in expected):
        assert CODEC.encode_many(records) == expected
    else:
        with pytest.raises(RecordTypeError):
            CODEC.encode_many(records)


PACKED_DEPTH = 64  # _speedups.c's PACK_MAX_DEPTH: containers nested this deep are packed, deeper ones declined


def _nested(depth: int) -> list[object]:
    """`depth` lists, each (but the innermost, empty one) holding the next."""
    record: list[object] = []
    for _ in range(depth - 1):
        record = [record]
    return record


def test_declined_records_are_left_to_the_python_path():
    declined = [{"a": np.arange(4) % 2 == 0}, {"e": np.zeros((0, 3), np.float32)}, {"s": np.float32(1)}, {"n": 2**64},
                {"k": Colour.RED}, {b"bytes key": 1}, {"t": "\ud800"}, {"m": {str(k): k for k in range(33)}},
                _nested(PACKED_DEPTH + 1)]
    for record in declined:
        assert speedups.msgpack_pack(record, np.ndarray, PACKED_DTYPES) is None, record
    assert CODEC.encode(declined[-1]) == python_outcome(declined[-1])


def test_the_deepest_record_packed_in_c_and_the_first_declined():
    deepest = _nested(PACKED_DEPTH)
    assert speedups.msgpack_pack(deepest, np.ndarray, PACKED_DTYPES) == python_outcome(deepest) == b"\x91" * 63 + b"\x90"
    assert speedups.msgpack_pack(_nested(PACKED_DEPTH + 1), np.ndarray, PACKED_DTYPES) is None


def test_a_record_a_reader_would_refuse_is_declined_though_it_packs():
    many_empty_maps = [{}] * 40_000  # §2.2's memory rule: 144 bytes of objects per payload byte
    assert speedups.msgpack_pack(many_empty_maps, np.ndarray, PACKED_DTYPES) is None
    with pytest.raises(RecordTypeError):
        CODEC.encode(many_empty_maps)


def test_extension_lengths_of_every_header_class():
    for size in (3, 4, 20, 200, 240, 256, 65_536, 70_000):  # fixext 16 for 3 bytes of u1, ext 8, 16 and 32
        record = {"a": np.arange(size, dtype=np.uint8)}
        assert speedups.msgpack_pack(record, np.ndarray, PACKED_DTYPES) == python_outcome(record)


def test_pack_refuses_wrong_arguments():
    with pytest.raises(TypeError):
        speedups.msgpack_pack({}, np.ndarray)
    with pytest.raises(TypeError):
        speedups.msgpack_pack({}, np.ndarray, ((np.dtype("f4"), "<f4"),))
    with pytest.raises(TypeError):
        speedups.msgpack_pack_each(({},), np.ndarray, PACKED_DTYPES)


@given(records=st.lists(plain_records, max_size=30), checksums=st.booleans())
def test_structured_shard_is_the_same_file_with_and_without_the_extension(records, checksums):
    records = [record for record in records if isinstance(python_outcome(record), bytes)]

    def write(path: str, extend: bool) -> str:
        with varstore.Writer(path, "msgpack", checksums=checksums) as writer:
            if extend:
                writer.extend(records)
            else:
                for record in records:
                    writer.append(record)
        return path

    with tempfile.TemporaryDirectory() as directory:
        fast_extend, fast_append = write(os.path.join(directory, "e"), True), write(os.path.join(directory, "a"), False)
        with extension_disabled():
            slow = write(os.path.join(directory, "slow"), True)
        assert shard_bytes(fast_extend) == shard_bytes(slow) == shard_bytes(fast_append)

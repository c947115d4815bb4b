"""Whatever a codec's writer accepts, its readers return equal; whatever they could not, the writer refuses.

Each property feeds a real Writer the widest inputs its codec takes, then reads the shard back with a
Reader, `verify()` and the spec-only reader: an appended record reads back equal after the documented
normalisation (spec §2.2, docs/writing.md "Codecs"), a refused one raised RecordTypeError at `append`, and no
record is ever written that fails to read. The expected outcome is computed here from the documented
rules, not by the codec, so a codec that refuses too much fails as surely as one that stores too much.
"""

from __future__ import annotations

import math
import struct

import hypothesis.extra.numpy as hnp
import msgpack
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import varstore
from varstore.format import codecs as codecs_module
from varstore.format.codecs import ALLOWED_DTYPES, MsgpackCodec
from varstore.format.msgpack_bounds import check_msgpack

from . import spec_reader
from .test_untrusted_input import array_extension, msgpack_shard

INT_EDGES = [0, 1, -1, 2**63 - 1, 2**63, 2**64 - 1, -(2**63)]  # msgpack holds [-2**63, 2**64)
INTS_BEYOND = [2**64, -(2**63) - 1, 2**70, -(2**70)]
INTEGER_DTYPES = [name for name in ALLOWED_DTYPES if np.dtype(name).kind in "iu"]
# Source dtypes for the ndarray codec: every allowed one, their big-endian twins, and a few no shard holds.
SOURCE_DTYPES = sorted({*ALLOWED_DTYPES, *(np.dtype(name).newbyteorder(">").str for name in ALLOWED_DTYPES), "<f16"})


def same(a, b) -> bool:
    """Exact equality of records as read: arrays by dtype, shape and bytes; floats bit for bit (NaN, -0.0)."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (
            isinstance(a, np.ndarray) and isinstance(b, np.ndarray)
            and a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
        )
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[key], b[key]) for key in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(map(same, a, b))
    if isinstance(a, float):
        return struct.pack("<d", a) == struct.pack("<d", b)
    return a == b


# -- msgpack --------------------------------------------------------------------------------------------


class Refused(Exception):
    """Raised by `as_read` for what the documentation says a writer refuses."""


def _little_endian(array: np.ndarray) -> np.ndarray:
    if array.dtype.newbyteorder("<").str not in ALLOWED_DTYPES:
        raise Refused(f"dtype {array.dtype}")
    if array.size == 0:
        leading = array.shape[: array.shape.index(0)]
        if any(dim > max(5 + 8 * array.ndim, 1 << 16) for dim in leading) or math.prod(dim or 1 for dim in array.shape) > 1 << 24:
            raise Refused(f"empty array of shape {array.shape} claims more than its extension justifies")
    return np.array(array, dtype=array.dtype.newbyteorder("<"), order="C")


def as_read_key(key):
    if isinstance(key, np.integer):
        key = int(key)
    if isinstance(key, bool) or not isinstance(key, (str, int)):
        raise Refused(f"key {key!r}")
    return as_read(key)


def as_read(value, depth: int = 0):
    """`value` as the documentation says a reader returns it, or Refused."""
    if depth > 20:
        raise AssertionError("strategies nest shallowly")
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, np.generic) and not isinstance(value, (float, str, bytes)):
        return _little_endian(np.asarray(value))  # numpy scalars read back as 0-d arrays
    if isinstance(value, np.ndarray):
        return _little_endian(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, int):
        if not -(2**63) <= value < 2**64:
            raise Refused(f"integer {value}")
        return int(value)
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise Refused("lone surrogate") from None
        return str(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(memoryview(value).tobytes())
    if isinstance(value, (list, tuple)):
        return [as_read(item, depth + 1) for item in value]
    if isinstance(value, dict):
        result = {}
        for key, item in value.items():
            result[as_read_key(key)] = as_read(item, depth + 1)
        if len(result) != len(value):
            raise Refused("two keys made equal")
        return result
    raise Refused(type(value).__name__)


def numpy_scalars(dtype: str) -> st.SearchStrategy:
    return hnp.from_dtype(np.dtype(dtype)).map(np.dtype(dtype).type)


def odd_layouts(array: np.ndarray) -> st.SearchStrategy[np.ndarray]:
    """The array as given, big-endian, strided every other element, and transposed (not C-contiguous)."""
    options = [array, array[::2], array.T] if array.ndim else [array]
    if array.dtype.itemsize > 1:
        options.append(array.astype(array.dtype.newbyteorder(">")))
    return st.sampled_from(options)


def wide_arrays(max_side: int = 5) -> st.SearchStrategy[np.ndarray]:
    return st.sampled_from(ALLOWED_DTYPES).flatmap(
        lambda dtype: hnp.arrays(np.dtype(dtype), hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=max_side))
    ).flatmap(odd_layouts)


def empty_arrays() -> st.SearchStrategy[np.ndarray]:
    """Empty arrays whose other dimensions may claim more than the extension's bytes (spec §2.2)."""
    shapes = st.lists(st.integers(0, 40), max_size=2).flatmap(lambda dims: st.permutations([0, *dims])).map(tuple)
    return st.tuples(shapes, st.sampled_from(ALLOWED_DTYPES)).map(lambda case: np.zeros(*case))


def memoryviews() -> st.SearchStrategy[memoryview]:
    arrays = st.sampled_from(["<u1", "<i4", ">f8", "<c8"]).flatmap(
        lambda dtype: hnp.arrays(np.dtype(dtype), hnp.array_shapes(min_dims=0, max_dims=2, max_side=4))
    )
    return arrays.flatmap(odd_layouts).map(memoryview) | st.binary(max_size=9).map(memoryview)


def texts() -> st.SearchStrategy[str]:
    return st.text(max_size=8) | st.sampled_from(["\ud800", "a\udfffb", "\U0001f600"])


def rarely(common: st.SearchStrategy, rare: st.SearchStrategy) -> st.SearchStrategy:
    """`rare` one draw in eight: a record with one refused part is refused whatever else it holds,
    so refusals must be rare for the accepted records (and each single reason to refuse) to be explored."""
    return st.integers(0, 7).flatmap(lambda draw: rare if draw == 0 else common)


msgpack_keys = rarely(
    st.text(max_size=8) | st.integers(-(2**63), 2**64 - 1) | st.sampled_from(INT_EDGES)
    | st.sampled_from(INTEGER_DTYPES).flatmap(numpy_scalars)
    | st.text(max_size=8).filter(lambda text: "\x00" not in text).map(np.str_),
    st.booleans() | st.none() | st.floats() | st.binary(max_size=4) | st.tuples(st.integers(0, 3), st.integers(0, 3))
    | numpy_scalars("<f8") | numpy_scalars("|b1") | st.sampled_from(INTS_BEYOND) | texts().map(np.str_),
)
msgpack_leaves = rarely(
    st.none() | st.booleans()
    | st.integers(-(2**63), 2**64 - 1) | st.sampled_from(INT_EDGES)
    | st.floats() | st.sampled_from([math.nan, -0.0, math.inf, -math.inf])
    | st.text(max_size=8)
    | st.binary(max_size=12) | st.binary(max_size=12).map(bytearray) | memoryviews()
    | st.sampled_from(ALLOWED_DTYPES).flatmap(numpy_scalars)
    | wide_arrays() | empty_arrays(),
    texts() | st.sampled_from(INTS_BEYOND) | st.sampled_from([np.array([1, "a"], dtype=object),
                                np.datetime64("2024-01-01"), {1, 2}, 1j, np.array(["x"])]),
)
msgpack_records = st.recursive(
    msgpack_leaves,
    lambda children: (
        st.lists(children, max_size=4)
        | st.lists(children, max_size=4).map(tuple)
        | st.dictionaries(msgpack_keys, children, max_size=4)
    ),
    max_leaves=10,
)


def written_and_expected(prefix, codec: str, records: list, expected_of, **options) -> list:
    """Append every record; check each was refused exactly when `expected_of` says; return what was accepted."""
    accepted = []
    with varstore.Writer(prefix, codec=codec, **options) as writer:
        for record in records:
            try:
                expected = expected_of(record)
            except Refused:
                with pytest.raises(varstore.RecordTypeError):
                    writer.append(record)
            else:
                writer.append(record)
                accepted.append(expected)
    return accepted


def assert_reads_back(prefix, expected: list) -> None:
    with varstore.open(prefix) as reader:
        reader.verify()
        assert len(reader) == len(expected)
        assert all(same(got, want) for got, want in zip(reader, expected, strict=True))
        assert all(map(same, reader.get_batch(range(len(expected))), expected))
    spelled = spec_reader.read_shard(str(prefix))["records"]
    assert all(same(got, want) for got, want in zip(spelled, expected, strict=True))


@given(st.lists(msgpack_records, min_size=1, max_size=6))
def test_msgpack_writer_accepts_only_what_every_reader_returns_equal(tmp_path_factory, records):
    prefix = tmp_path_factory.mktemp("msgpack") / "records"
    expected = written_and_expected(prefix, "msgpack", records, as_read)
    assert_reads_back(prefix, expected)


def test_numpy_integer_keys_are_stored_as_int_and_read_back(tmp_path):
    labels = np.array([3, 1, 3, 7], np.int64)
    names = ["cat", "dog", "owl"]
    record = {"names": dict(zip(np.unique(labels), names)), "by_uint": {np.uint64(2**64 - 1): 1, np.int8(-3): 2}}
    with varstore.Writer(tmp_path / "keys", codec="msgpack") as writer:
        writer.append(record)
    with varstore.open(tmp_path / "keys") as reader:
        reader.verify()
        assert reader[0] == {"names": {1: "cat", 3: "dog", 7: "owl"}, "by_uint": {2**64 - 1: 1, -3: 2}}
        assert [type(key) for key in reader[0]["names"]] == [int, int, int]


@pytest.mark.parametrize("key", [(1, 2), b"k", None, 1.5, True, np.float64(2.0), np.bool_(True), frozenset(), 2**64],
                         ids=repr)
def test_map_keys_other_than_str_and_int_are_refused_at_append_naming_the_key(tmp_path, key):
    with varstore.Writer(tmp_path / "keys", codec="msgpack") as writer:
        with pytest.raises(varstore.RecordTypeError, match=r"key|outside msgpack's range"):
            writer.append({"ok": {key: 1}})
        writer.append({"ok": 1})
    with varstore.open(tmp_path / "keys") as reader:
        assert list(reader) == [{"ok": 1}]


def test_keys_that_become_one_key_once_stored_are_refused_at_append(tmp_path):
    class HashedByIdentity(int):  # equal to 1 as stored, yet a second key of the dict
        __hash__ = object.__hash__
        __eq__ = object.__eq__

    with pytest.raises(varstore.RecordTypeError, match="key"):
        varstore.Writer(tmp_path / "keys", codec="msgpack").append({HashedByIdentity(1): "a", 1: "b"})


@pytest.mark.parametrize("payload", [
    b"\x82\xa1a\x01\xa1a\x02",  # {"a": 1, "a": 2}
    b"\x82\x01\xc0\xcc\x01\xc0",  # {1: nil, 1 (as uint8): nil}
    b"\x82\xa1a\x01\xd9\x01a\x02",  # "a" as fixstr and as str8
    b"\x81\xc0\x01", b"\x81\xc3\x01", b"\x81\xcb" + struct.pack(">d", 1.0) + b"\x01", b"\x81\xc4\x01k\x01",
    b"\x81\x92\x01\x02\x01", b"\x81\x80\x01",
    b"\x91\x81" + array_extension(b"<i8", (), struct.pack("<q", 1)) + b"\x01",  # the key an old writer made of np.int64
], ids=lambda payload: payload.hex())
def test_msgpack_map_with_a_repeated_or_non_str_int_key_is_a_damaged_record(tmp_path, payload):
    msgpack_shard(tmp_path / "docs", [msgpack.packb({"fine": 1}), payload])
    with varstore.open(tmp_path / "docs") as reader:
        assert reader[0] == {"fine": 1}
        with pytest.raises(varstore.CorruptRecordError, match="key") as caught:
            reader[1]
        assert caught.value.records == [1]
        with pytest.raises(varstore.CorruptRecordError) as caught:
            reader.verify()
        assert caught.value.records == [1]
    with pytest.raises(spec_reader.SpecError, match="key"):
        spec_reader.read_shard(str(tmp_path / "docs"))


def test_tuples_read_back_as_lists_and_float_like_numpy_scalars_as_floats(tmp_path):
    record = {"pair": (1, (2, 3)), "f64": np.float64(0.5), "f32": np.float32(0.5), "flag": np.bool_(True)}
    with varstore.Writer(tmp_path / "docs", codec="msgpack") as writer:
        writer.append(record)
    with varstore.open(tmp_path / "docs") as reader:
        read = reader[0]
    assert read["pair"] == [1, [2, 3]] and type(read["f64"]) is float
    assert same(read["f32"], np.array(0.5, np.float32)) and same(read["flag"], np.array(True))


def test_non_contiguous_memoryview_is_stored_as_its_bytes(tmp_path):
    strided = memoryview(np.arange(6, dtype="<i4"))[::2]
    with varstore.Writer(tmp_path / "docs", codec="msgpack") as writer:
        writer.append({"view": strided})
    with varstore.open(tmp_path / "docs") as reader:
        assert reader[0] == {"view": strided.tobytes()}


class Pairs(list):
    """A map as a list of (key, value) pairs, so a test can pack repeated keys."""


def _pack_pairs(value) -> bytes:
    if isinstance(value, Pairs):
        return _map_header(len(value)) + b"".join(msgpack.packb(key) + _pack_pairs(item) for key, item in value)
    if isinstance(value, list):
        return _array_header(len(value)) + b"".join(_pack_pairs(item) for item in value)
    return msgpack.packb(value)


def _map_header(length: int) -> bytes:
    return bytes([0x80 | length]) if length < 16 else b"\xde" + struct.pack(">H", length)


def _array_header(length: int) -> bytes:
    return bytes([0x90 | length]) if length < 16 else b"\xdc" + struct.pack(">H", length)


def _keys_allowed(value) -> bool:
    """Spec §2.2 from the source structure: every key str or int (not bool), none twice in one map."""
    if isinstance(value, Pairs):
        keys = [key for key, _ in value]
        return (
            all(isinstance(key, (str, int)) and not isinstance(key, bool) for key in keys)
            and len({(type(key), key) for key in keys}) == len(keys)
            and all(_keys_allowed(item) for _, item in value)
        )
    return all(map(_keys_allowed, value)) if isinstance(value, list) else True


pair_keys = st.sampled_from(["a", "b", "", 0, 1, -1, -33, 200, 2**40, 2**64 - 1, -(2**63), None, True, False, 1.0, b"a"])
pair_maps = st.recursive(
    st.none() | st.integers(-5, 5) | st.text(max_size=3),
    lambda children: st.lists(children, max_size=3) | st.lists(st.tuples(pair_keys, children), max_size=4).map(Pairs),
    max_leaves=12,
)


@given(pair_maps)
def test_msgpack_check_refuses_exactly_the_maps_with_a_non_str_int_or_repeated_key(value):
    payload = _pack_pairs(value)
    if _keys_allowed(value):
        check_msgpack(payload, 1)
    else:
        with pytest.raises(ValueError, match="key"):
            check_msgpack(payload, 1)


# -- array extension shapes (item 14) -------------------------------------------------------------------

ISSUE_RECORD = msgpack.packb({"x": msgpack.ExtType(1, b"\x03<f4\x02" + struct.pack("<2Q", 2**33, 0))})


def test_empty_array_whose_shape_claims_more_than_its_bytes_is_a_damaged_record(tmp_path):
    assert len(ISSUE_RECORD) < 32
    msgpack_shard(tmp_path / "docs", [ISSUE_RECORD])
    with varstore.open(tmp_path / "docs") as reader:
        with pytest.raises(varstore.CorruptRecordError, match="claims more than it holds"):
            reader[0]
        with pytest.raises(varstore.CorruptRecordError) as caught:
            reader.verify()
        assert caught.value.records == [0]
    with pytest.raises(ValueError, match="claims more"):
        MsgpackCodec().decode(ISSUE_RECORD, 0, len(ISSUE_RECORD))
    with pytest.raises(spec_reader.SpecError, match="empty array"):
        spec_reader.read_shard(str(tmp_path / "docs"))


@pytest.mark.parametrize("shape", [(2**33, 0), (2**24, 0), (2**16 + 1, 0), (3, 2**16 + 1, 0), (0, 2**24 + 1), (0, 4097, 4096), (0,) + (2,) * 30])
def test_empty_array_whose_shape_claims_more_than_its_bytes_is_refused_at_append(tmp_path, shape):
    with pytest.raises(varstore.RecordTypeError, match="empty array"):
        varstore.Writer(tmp_path / "docs", codec="msgpack").append({"x": np.zeros(shape, np.float32)})


@pytest.mark.parametrize("shape", [(0,), (0, 768), (0, 17, 3), (0, 480, 640), (300, 0, 3), (2**16, 0), (3, 0, 5), (0, 4096, 4096), (0,) * 31])
def test_empty_arrays_within_their_bytes_round_trip(tmp_path, shape):
    with varstore.Writer(tmp_path / "docs", codec="msgpack") as writer:
        writer.append({"x": np.zeros(shape, np.float32)})
    with varstore.open(tmp_path / "docs") as reader:
        assert reader[0]["x"].shape == shape
    spec_reader.read_shard(str(tmp_path / "docs"))


# -- array headers decoded before (issue 15: a header seen once is not parsed again) ----------------------


@given(st.lists(wide_arrays(), min_size=1, max_size=4), st.integers(0, 3))
def test_an_array_decodes_the_same_whether_its_header_was_seen_before_or_not(arrays, repeats):
    codec = MsgpackCodec()
    payload = bytes(codec.encode({"arrays": arrays}))
    for _ in range(1 + repeats):  # the first decode parses each header; later ones find it known
        decoded = codec.decode(payload, 0, len(payload))["arrays"]
        for original, got in zip(arrays, decoded, strict=True):
            assert got.shape == original.shape and got.dtype == original.dtype.newbyteorder("<")
            assert np.array_equal(got, original, equal_nan=True)


def test_a_known_array_header_with_a_body_of_another_size_is_refused():
    whole = array_extension(b"<f4", (4,), bytes(16))
    short = array_extension(b"<f4", (4,), bytes(12))
    long = array_extension(b"<f4", (4,), bytes(20))
    codec = MsgpackCodec()
    assert codec.decode(whole, 0, len(whole)).shape == (4,)  # the header is now known
    for forged in (short, long):
        with pytest.raises(ValueError, match="does not match its"):
            codec.decode(forged, 0, len(forged))


def test_bool_arrays_are_checked_on_every_read_not_only_the_first():
    good = array_extension(b"|b1", (3,), b"\x00\x01\x01")
    forged = array_extension(b"|b1", (3,), b"\x00\x02\x01")
    codec = MsgpackCodec()
    for _ in range(2):
        assert codec.decode(good, 0, len(good)).tolist() == [False, True, True]
    with pytest.raises(ValueError):
        codec.decode(forged, 0, len(forged))


def test_headers_kept_for_reuse_stay_few_however_many_shapes_are_read():
    codec = MsgpackCodec()
    for rows in range(1, 3 * codecs_module._ARRAY_HEADERS_KEPT):
        payload = array_extension(b"|u1", (rows,), bytes(rows))
        assert codec.decode(payload, 0, len(payload)).shape == (rows,)
        assert len(codecs_module._ARRAY_HEADERS) <= codecs_module._ARRAY_HEADERS_KEPT


# -- bytes and str ----------------------------------------------------------------------------------------


def bytes_as_read(record):
    if isinstance(record, (bytes, bytearray, memoryview)):
        return memoryview(record).tobytes()
    raise Refused(type(record).__name__)


def str_as_read(record):
    if not isinstance(record, str):
        raise Refused(type(record).__name__)
    try:
        record.encode("utf-8")
    except UnicodeEncodeError:
        raise Refused("lone surrogate") from None
    return record


@given(st.lists(st.binary(max_size=20) | st.binary(max_size=20).map(bytearray) | memoryviews() | texts()
                | st.integers(0, 9) | wide_arrays(), max_size=8))
def test_bytes_writer_accepts_only_bytes_like_records_and_stores_their_bytes_in_c_order(tmp_path_factory, records):
    prefix = tmp_path_factory.mktemp("bytes") / "records"
    assert_reads_back(prefix, written_and_expected(prefix, "bytes", records, bytes_as_read))


@given(st.lists(texts() | st.binary(max_size=5) | st.none(), max_size=8))
def test_str_writer_refuses_lone_surrogates_and_non_str(tmp_path_factory, records):
    prefix = tmp_path_factory.mktemp("str") / "records"
    assert_reads_back(prefix, written_and_expected(prefix, "str", records, str_as_read))


# -- ndarray --------------------------------------------------------------------------------------------


def stored_as(array: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """The documented cast (spec §2.1): integers only when every value fits, floats may round but a finite
    value never becomes infinite, NaN and infinities stay, and nothing else changes kind."""
    source = array.dtype
    if source.kind == "c" and dtype.kind != "c" or source.kind in "fc" and dtype.kind in "biu" or source.kind not in "biufc":
        raise Refused(f"{source} into {dtype}")
    if dtype.kind == "b" and source.kind != "b":
        raise Refused(f"{source} into bool")
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        if any(not info.min <= int(value) <= info.max for value in array.reshape(-1).tolist()):
            raise Refused("integer out of range")
        return array.astype(dtype)
    with np.errstate(over="ignore", invalid="ignore"):
        cast = array.astype(dtype)
    parts = (lambda a: (a.real, a.imag)) if dtype.kind == "c" else (lambda a: (a,))
    source_parts = parts(array.astype(np.clongdouble if source.kind == "c" else np.longdouble))
    if any((np.isinf(stored) & np.isfinite(original)).any() for stored, original in zip(parts(cast), source_parts)):
        raise Refused("overflow")
    return cast


def source_arrays(trailing: tuple[int, ...]) -> st.SearchStrategy[np.ndarray]:
    dtypes = st.sampled_from(SOURCE_DTYPES).map(np.dtype)
    edges = st.sampled_from([65504.0, 65520.0, 70000.0, 3.4028235e38, 1e39, 2.0**31 + 1, 2.0**63, 2.0**64, 1e300])
    finite_edges = edges.flatmap(lambda value: st.sampled_from([value, -value]))

    def arrays(dtype: np.dtype) -> st.SearchStrategy[np.ndarray]:
        elements = hnp.from_dtype(dtype)
        if dtype.kind == "f" and dtype.itemsize >= 8 or dtype.kind == "c" and dtype.itemsize >= 16:
            elements = elements | finite_edges
        return hnp.arrays(dtype, st.tuples(st.integers(0, 6), *map(st.just, trailing)), elements=elements)

    objects = st.just(np.ones((1, *trailing), dtype=object))
    numeric = dtypes.flatmap(arrays)
    return st.integers(0, 9).flatmap(lambda draw: objects if draw == 0 else numeric).flatmap(
        lambda array: st.sampled_from([array, array[::2], np.asfortranarray(array)])
    )


@given(
    st.sampled_from(ALLOWED_DTYPES).map(np.dtype),
    st.sampled_from([(), (2,)]).flatmap(lambda trailing: st.tuples(st.just(trailing), st.lists(source_arrays(trailing), max_size=6))),
)
def test_ndarray_writer_stores_exactly_the_documented_cast_or_refuses(tmp_path_factory, dtype, case):
    trailing, records = case
    prefix = tmp_path_factory.mktemp("ndarray") / "records"
    expected = written_and_expected(
        prefix, "ndarray", records, lambda array: stored_as(array, dtype), dtype=dtype, shape=trailing
    )
    assert_reads_back(prefix, expected)


@pytest.mark.parametrize(("dtype", "value"), [
    ("float16", 70000.0), ("float16", 65520), ("float16", -1e10), ("float32", 1e39), ("float32", -1e39),
    ("float32", 2.0**128), ("complex64", 1e39 + 1j), ("complex64", 1j * 1e39), ("float16", np.uint64(2**64 - 1)),
], ids=repr)
def test_finite_value_that_would_become_infinite_is_refused(tmp_path, dtype, value):
    with varstore.Writer(tmp_path / "floats", codec="ndarray", dtype=dtype) as writer:
        with pytest.raises(varstore.RecordTypeError, match="overflows"):
            writer.append(np.array([1.0, value]) if not isinstance(value, np.generic) else np.array([1, value]))


def test_float_rounding_nan_and_infinity_are_stored(tmp_path):
    with varstore.Writer(tmp_path / "floats", codec="ndarray", dtype="float32") as writer:
        writer.append(np.array([2**31 + 1], np.int64))
        writer.append(np.array([math.nan, math.inf, -math.inf, 3.4028235e38, -0.0]))
    with varstore.open(tmp_path / "floats") as reader:
        assert reader[0].tolist() == [2.0**31]
        assert same(reader[1], np.array([math.nan, math.inf, -math.inf, 3.4028235e38, -0.0], np.float32))



@pytest.mark.parametrize("shape", [(2**32 - 1, 2**32 - 1), (2**16,) * 4, (2**21,) * 3])
def test_trailing_shape_whose_rows_no_array_can_hold_is_refused_by_the_writer(tmp_path, shape):
    with pytest.raises(varstore.RecordTypeError, match="2\\*\\*63"):
        varstore.Writer(tmp_path / "rows", codec="ndarray", dtype="int8", shape=shape)
    assert list(tmp_path.iterdir()) == []


def test_largest_trailing_shape_the_writer_takes_opens(tmp_path):
    with varstore.Writer(tmp_path / "rows", codec="ndarray", dtype="int8", shape=(2**21, 2**21, 2**20)):
        pass
    with varstore.open(tmp_path / "rows") as reader:
        assert len(reader) == 0 and reader.shape == (2**21, 2**21, 2**20)

"""Codecs turn Python records into payload bytes and back; a shard records its codec so reads decode unaided.

Four codecs, each with a fixed id in the index header:

- ``bytes`` (0): the payload is the record.
- ``str`` (1): UTF-8 text.
- ``ndarray`` (2): one dtype and optional fixed trailing shape per shard; a record
  of shape ``(L, *shape)`` is its C-order little-endian elements, and reads are
  zero-copy read-only views of the map. A ``|b1`` element is the byte 0 or 1.
- ``msgpack`` (3): structured samples (dicts with str or int keys, lists, str, int,
  float, bool, None, bytes, numpy arrays). Arrays use msgpack extension type 1;
  numpy float64, str_ and bytes_ are Python float, str and bytes and are stored as
  such, every other numpy scalar as a 0-d array. A writer refuses what a reader
  would not return equal after the normalisations of spec §2.2 (tuples read
  back as lists, numpy integer keys as int, numpy scalars as 0-d arrays, IntEnum
  members and other int, float, str and bytes subclasses as the base type, ...).

Codec parameters stored in a shard or manifest are exact (spec §2): a missing or
unknown member is a FormatError, never a default.

Nothing here ever pickles or evaluates.
"""

from __future__ import annotations

import math
import operator
import struct
from typing import Any, Callable, Sequence

import msgpack
import numpy as np

from .._native import speedups
from ..errors import FormatError, RecordTypeError
from .msgpack_bounds import MAX_DEPTH, check_msgpack

ARRAY_EXT_TYPE = 1
MAX_ARRAY_DIMS = 32
# An empty array's non-zero dimensions may multiply to at most this (spec §2.2): (0, 4096, 4096) is fine.
MAX_EMPTY_ARRAY_EXTENT = 1 << 24
# ... and each of its dimensions before the first 0 at most this: (300, 0, 3) is fine, (2**24, 0) is not.
MAX_EMPTY_ARRAY_LEADING = 1 << 16
# Each dimension of an ndarray shard's trailing shape is below this (spec §2.1).
MAX_TRAILING_DIMENSION = 1 << 32
# An ndarray shard's row (itemsize x trailing shape) must fit one numpy array (spec §2.1).
MAX_ROW_SIZE = (1 << 63) - 1

# The dtypes a shard or a msgpack array may hold, always little-endian on disk.
ALLOWED_DTYPES = ("|b1", "|i1", "|u1", "<i2", "<u2", "<i4", "<u4", "<i8", "<u8", "<f2", "<f4", "<f8", "<c8", "<c16")


def canonical_dtype(dtype: Any) -> np.dtype:
    """The little-endian form of `dtype`, or a RecordTypeError if the format does not allow it."""
    try:
        resolved = np.dtype(dtype).newbyteorder("<")
    except TypeError as error:
        raise RecordTypeError(f"not a numpy dtype: {dtype!r} ({error})") from None
    if resolved.str not in ALLOWED_DTYPES:
        raise RecordTypeError(f"dtype {np.dtype(dtype)} is not supported; allowed: {', '.join(ALLOWED_DTYPES)}")
    return resolved


def check_bool_bytes(values: np.ndarray) -> None:
    """Raise ValueError naming the first of the bytes `values` (uint8, the elements of a ``|b1`` array) that is
    neither 0 nor 1: numpy reads any non-zero byte as True, so another value has no single meaning (spec §2.1)."""
    invalid = values > 1
    if invalid.any():
        position = int(invalid.argmax())
        raise ValueError(f"|b1 element {position} is the byte {int(values.flat[position])}; a |b1 element is 0 or 1")


def trailing_shape(shape: Sequence[Any]) -> tuple[int, ...]:
    """`shape` as a tuple of ints, or a RecordTypeError unless it is at most 31 integers, each in [1, 2**32)
    (spec §2.1): the one rule for a writer's `shape` argument and for a shape stored in a shard or manifest."""
    try:
        dims = tuple(shape)
    except TypeError:
        raise RecordTypeError(f"trailing shape {shape!r} must be a sequence of integers") from None
    if len(dims) >= MAX_ARRAY_DIMS or not all(_is_trailing_dimension(dim) for dim in dims):
        raise RecordTypeError(
            f"trailing shape {list(dims)!r} must be at most {MAX_ARRAY_DIMS - 1} integers, each in [1, 2**32)"
        )
    return tuple(operator.index(dim) for dim in dims)


def _is_trailing_dimension(dim: Any) -> bool:
    """Whether `dim` is an integer (not a bool, not a float) in [1, 2**32)."""
    if isinstance(dim, (bool, np.bool_)):
        return False
    try:
        return 1 <= operator.index(dim) < MAX_TRAILING_DIMENSION
    except TypeError:
        return False


def _dtype_from_stored(text: Any, *, path: str) -> np.dtype:
    if not isinstance(text, str) or text not in ALLOWED_DTYPES:
        raise FormatError(f"stored dtype {text!r} is not one of {', '.join(ALLOWED_DTYPES)}", path=path)
    return np.dtype(text)


class Codec:
    """Base of the four codecs: `encode` gives a bytes-like payload, `decode` reads one from a buffer."""

    id: int
    name: str
    param_names: tuple[str, ...] = ()  # exactly the members of `params()`, all required (spec §2)

    def params(self) -> dict[str, Any]:
        """The parameters stored in the shard's metadata so a reader can rebuild this codec."""
        return {}

    def encode(self, record: Any) -> bytes | bytearray | memoryview:
        raise NotImplementedError

    def decode(self, buffer: Any, start: int, end: int) -> Any:
        """Decode the payload at `buffer[start:end]`; raises ValueError-like errors on bad bytes."""
        raise NotImplementedError

    def decoder_for(self, buffer: Any) -> Callable[[Any, int, int], Any]:
        """A `decode` specialised to one mapped data file, prepared once when a shard opens."""
        return self.decode

    def encode_many(self, records: list[Any]) -> list[bytes]:
        """Each record's payload as immutable bytes (RecordTypeError if any is refused)."""
        return [payload if payload.__class__ is bytes else bytes(payload) for payload in map(self.encode, records)]


class BytesCodec(Codec):
    id, name = 0, "bytes"

    def encode_many(self, records: list[Any]) -> list[bytes]:
        if set(map(type, records)) <= {bytes}:  # the usual chunk: no call per record
            return records
        return super().encode_many(records)

    def encode(self, record: Any) -> bytes | bytearray | memoryview:
        if record.__class__ is bytes or isinstance(record, (bytes, bytearray)):
            return record
        if isinstance(record, memoryview):
            return record.cast("B") if record.c_contiguous else record.tobytes()
        raise RecordTypeError(f"the bytes codec takes bytes, bytearray or memoryview, not {type(record).__name__}")

    def decode(self, buffer: Any, start: int, end: int) -> bytes:
        return buffer[start:end]


class StrCodec(Codec):
    id, name = 1, "str"

    def encode(self, record: Any) -> bytes:
        if not isinstance(record, str):
            raise RecordTypeError(f"the str codec takes str, not {type(record).__name__}")
        try:
            return record.encode("utf-8")
        except UnicodeEncodeError as error:
            raise RecordTypeError(f"text cannot be encoded as UTF-8: {error}") from None

    def decode(self, buffer: Any, start: int, end: int) -> str:
        return str(buffer[start:end], "utf-8")


class NdarrayCodec(Codec):
    """Arrays of one dtype and trailing shape; a record's first dimension varies."""

    id, name = 2, "ndarray"
    param_names = ("dtype", "shape")

    def __init__(self, dtype: Any, shape: Sequence[int] = ()) -> None:
        self.dtype = canonical_dtype(dtype)
        self.shape = trailing_shape(shape)
        self.row_size = self.dtype.itemsize * math.prod(self.shape)
        self._ndim = 1 + len(self.shape)
        # numpy's own instance of the dtype, which arrays of it carry: encode's fast path tests identity, not
        # equality (None for |b1, whose bytes encode must check, and where byte order makes the dtype another).
        native = np.dtype(self.dtype.name) if self.dtype.kind != "b" else None
        self._plain_dtype = native if native == self.dtype else None
        if self.row_size > MAX_ROW_SIZE:
            raise RecordTypeError(
                f"rows of shape {self.shape} and dtype {self.dtype.str} would be {self.row_size} bytes, "
                f"more than 2**63 - 1: no array can hold one"
            )

    def params(self) -> dict[str, Any]:
        return {"dtype": self.dtype.str, "shape": list(self.shape)}

    def encode(self, record: Any) -> bytes | memoryview:
        if record.__class__ is np.ndarray and record.dtype is self._plain_dtype and record.ndim == self._ndim \
                and record.shape[1:] == self.shape:
            return record.tobytes()  # the usual record: exactly the shard's dtype, one copy in C order
        array = np.asarray(record)
        if array.ndim != 1 + len(self.shape) or array.shape[1:] != self.shape:
            raise RecordTypeError(f"record of shape {array.shape} does not fit the shard's shape (L, *{self.shape})")
        array = _cast_exactly(array, self.dtype)
        payload = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
        if self.dtype.kind == "b":
            _refuse_invalid_bools(payload)
        return memoryview(payload)  # type: ignore[arg-type]

    def decode(self, buffer: Any, start: int, end: int) -> np.ndarray:
        return self.decoder_for(buffer)(buffer, start, end)

    def rows(self, buffer: Any) -> np.ndarray:
        """The whole buffer as one read-only array of rows; it must hold a whole number of rows.

        Its ``|b1`` bytes are not checked here (that would read the whole buffer): whoever hands out
        records from these rows checks them with `records_with_invalid_bools` or `check_bool_bytes`."""
        if len(buffer) % self.row_size:
            raise ValueError(f"{len(buffer)} bytes are not a whole number of {self.row_size}-byte rows")
        return np.frombuffer(buffer, self.dtype).reshape((-1, *self.shape))

    def decoder_for(self, buffer: Any) -> Callable[[Any, int, int], np.ndarray]:
        """Records become slices of one array over the whole map: a view each, no per-record frombuffer."""
        rows, row_size = self.rows(buffer), self.row_size
        data = np.frombuffer(buffer, np.uint8) if self.dtype.kind == "b" else None

        def decode(_buffer: Any, start: int, end: int) -> np.ndarray:
            if start % row_size or end % row_size:
                raise ValueError(f"offsets [{start}, {end}) are not on {row_size}-byte row boundaries")
            if data is not None:
                check_bool_bytes(data[start:end])
            return rows[start // row_size : end // row_size]

        return decode

    def records_with_invalid_bools(self, data: np.ndarray, offsets: np.ndarray) -> np.ndarray:
        """Positions k of the records ``data[offsets[k]:offsets[k + 1]]`` holding a byte other than 0 or 1, for a
        ``|b1`` shard (always none for other dtypes): one vectorised pass over `data` (uint8) from offsets[0]
        to offsets[-1], for reads and verification of many records at once."""
        if self.dtype.kind != "b" or len(offsets) < 2:
            return np.zeros(0, np.int64)
        first = int(offsets[0])
        invalid = np.flatnonzero(data[first : int(offsets[-1])] > 1) + first
        return np.unique(np.searchsorted(offsets, invalid, "right") - 1)


def _cast_exactly(array: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Cast to the shard dtype only when no value changes beyond float rounding."""
    if array.dtype == dtype:
        return array
    if array.dtype.kind == "O" or array.dtype.kind not in "biufc":
        raise RecordTypeError(f"records of dtype {array.dtype} cannot be stored as {dtype}")
    if np.can_cast(array.dtype, dtype, "safe"):
        return array.astype(dtype)
    if dtype.kind in "iu" and array.dtype.kind in "biu":
        info = np.iinfo(dtype)
        if array.size and (array.min() < info.min or array.max() > info.max):
            raise RecordTypeError(
                f"values in [{array.min()}, {array.max()}] do not fit {dtype} [{info.min}, {info.max}]"
            )
        return array.astype(dtype)
    if dtype.kind in "fc" and np.can_cast(array.dtype, dtype, "same_kind"):
        return _cast_to_float(array, dtype)
    raise RecordTypeError(f"records of dtype {array.dtype} cannot be stored as {dtype} without changing values")


def _cast_to_float(array: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Cast into a float or complex dtype: finite values may round, but one that would become infinite is refused."""
    with np.errstate(over="ignore", invalid="ignore"):
        cast = array.astype(dtype)
    if _largest_magnitude(array.dtype) <= float(np.finfo(dtype).max):
        return cast
    for source, stored in zip(_real_parts(array), _real_parts(cast)):
        infinite = np.isinf(stored)
        if infinite.any():
            overflowed = np.flatnonzero(infinite & np.isfinite(source))
            if overflowed.size:
                value = array.reshape(-1)[overflowed[0]]
                raise RecordTypeError(
                    f"value {value} of dtype {array.dtype} overflows {dtype} (largest finite "
                    f"{np.finfo(dtype).max}): it would be stored as infinity"
                )
    return cast


def _largest_magnitude(dtype: np.dtype) -> float:
    if dtype.kind == "b":
        return 1.0
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return float(max(-int(info.min), int(info.max)))
    return float(np.finfo(dtype).max)


def _real_parts(array: np.ndarray) -> tuple[np.ndarray, ...]:
    return (array.real, array.imag) if array.dtype.kind == "c" else (array,)


def _refuse_invalid_bools(values: np.ndarray) -> None:
    """A writer's `check_bool_bytes`: a bool array viewing other bytes (``uint8s.view(bool)``) is refused, not
    normalised, so what is stored is exactly the array's bytes (spec §2.1)."""
    try:
        check_bool_bytes(values)
    except ValueError as error:
        raise RecordTypeError(f"{error}: this bool array views other bytes; store (array.view(np.uint8) != 0)") from None


def _pack_array(array: np.ndarray) -> msgpack.ExtType:
    dtype = canonical_dtype(array.dtype)
    if array.ndim >= MAX_ARRAY_DIMS:
        raise RecordTypeError(f"arrays may have at most {MAX_ARRAY_DIMS - 1} dimensions, not {array.ndim}")
    name = dtype.str.encode("ascii")
    head = bytes([len(name)]) + name + bytes([array.ndim]) + struct.pack(f"<{array.ndim}Q", *array.shape)
    body = np.ascontiguousarray(array, dtype=dtype).tobytes()
    if dtype.kind == "b":
        _refuse_invalid_bools(np.frombuffer(body, np.uint8))
    data = head + body
    if not array.size and (problem := _empty_shape_problem(array.shape)):
        raise RecordTypeError(f"an empty array of shape {array.shape} cannot be stored: {problem} (spec §2.2)")
    return msgpack.ExtType(ARRAY_EXT_TYPE, data)


def _empty_shape_problem(shape: Sequence[int]) -> str | None:
    """What is wrong with the shape of an empty array, if anything.

    §2.2 bounds what such a shape claims, so that no consumer that allocates by shape (a padding mask is
    batch x first dimension) reserves unboundedly: the dimensions before the first zero
    must each be at most 2**16, and the non-zero dimensions must multiply to at most 2**24."""
    leading = shape[: list(shape).index(0)] if 0 in shape else shape
    if any(dim > MAX_EMPTY_ARRAY_LEADING for dim in leading):
        return f"a dimension before its first 0 exceeds {MAX_EMPTY_ARRAY_LEADING}"
    extent = math.prod(dim or 1 for dim in shape)
    if extent > MAX_EMPTY_ARRAY_EXTENT:
        return f"its non-zero dimensions multiply to {extent}, more than {MAX_EMPTY_ARRAY_EXTENT}"
    return None


_DTYPES_BY_NAME = {name.encode("ascii"): np.dtype(name) for name in ALLOWED_DTYPES}
_SHAPES = [struct.Struct(f"<{ndim}Q") for ndim in range(MAX_ARRAY_DIMS)]


_ARRAY_HEADERS: dict[bytes, tuple[np.dtype, tuple[int, ...], int]] = {}  # header bytes -> dtype, shape, body size
_ARRAY_HEADERS_KEPT = 256  # a dataset's samples share a few headers; forged ones must not grow it without bound


def _unpack_array(data: bytes) -> np.ndarray:
    """The array an extension holds; a header seen before is not parsed and checked again, only its body's size."""
    if data and len(data) > 1 + data[0]:
        body_start = 2 + data[0] + 8 * data[1 + data[0]]
        known = _ARRAY_HEADERS.get(data[:body_start])
        if known is not None and len(data) - body_start == known[2]:
            dtype, shape, _ = known
            array = np.frombuffer(data, dtype, -1, body_start)  # positional: numpy parses keywords slowly
            return array if len(shape) == 1 else array.reshape(shape)
    return _parse_array(data)


def _parse_array(data: bytes) -> np.ndarray:
    if not data:
        raise ValueError("empty array extension")
    name_end = 1 + data[0]
    dtype = _DTYPES_BY_NAME.get(data[1:name_end])
    if dtype is None:
        raise ValueError(f"array extension has unsupported dtype {data[1:name_end]!r}")
    if len(data) <= name_end:
        raise ValueError("array extension is truncated after its dtype")
    ndim = data[name_end]
    body_start = name_end + 1 + 8 * ndim
    if ndim >= MAX_ARRAY_DIMS or len(data) < body_start:
        raise ValueError(f"array extension with {ndim} dimensions is truncated")
    shape = _SHAPES[ndim].unpack_from(data, name_end + 1)
    if math.prod(shape) * dtype.itemsize != len(data) - body_start:
        raise ValueError(f"array extension of shape {shape} and dtype {dtype.str} does not match its {len(data) - body_start} bytes")
    if len(data) == body_start and (problem := _empty_shape_problem(shape)):
        raise ValueError(f"empty array extension of shape {shape} claims more than it holds: {problem}")
    if dtype.kind == "b":
        check_bool_bytes(np.frombuffer(data, np.uint8, offset=body_start))
    elif len(data) > body_start and ndim:  # bools are checked on every read; empty and 0-d arrays are rare
        if len(_ARRAY_HEADERS) >= _ARRAY_HEADERS_KEPT:
            _ARRAY_HEADERS.clear()
        _ARRAY_HEADERS[data[:body_start]] = (dtype, shape, len(data) - body_start)
    array = np.frombuffer(data, dtype, -1, body_start)
    return array if ndim == 1 else array.reshape(shape)  # 1-D: frombuffer's length is shape[0], checked above


def _msgpack_default(value: Any) -> Any:
    if isinstance(value, (np.ndarray, np.generic)):
        return _pack_array(np.asarray(value))
    if isinstance(value, int):
        raise RecordTypeError(f"integer {value} is outside msgpack's range [-2**63, 2**64)")
    raise RecordTypeError(f"the msgpack codec cannot encode {type(value).__name__}")


def _packed(record: Any) -> bytes:
    """`record` packed and checked as a reader checks it (ValueError, TypeError or BufferError if it is not)."""
    payload = msgpack.packb(record, default=_msgpack_default, use_bin_type=True, datetime=False)
    check_msgpack(payload, ARRAY_EXT_TYPE)  # e.g. a msgpack.Timestamp, ExtType or a bytes key inside: readers refuse those
    return payload


def _normalised(record: Any) -> Any:
    """`record` rebuilt with numpy integer map keys as int and non-contiguous memoryviews as bytes, as a
    reader will return them; RecordTypeError for a map key a reader would refuse or two keys made equal.
    Iterative, depth first, so neither a deep nor a self-referential record can exhaust the stack."""
    root: list[Any] = [None]
    pending: list[tuple[Any, Any, Any, int]] = [(root, 0, record, 0)]  # (copy of the container, slot, value, depth)
    while pending:
        container, slot, value, depth = pending.pop()
        if depth > MAX_DEPTH:
            raise RecordTypeError(f"record cannot be encoded with msgpack: containers nest deeper than {MAX_DEPTH}")
        if isinstance(value, msgpack.ExtType):  # a tuple, but msgpack packs it as an extension, which readers refuse
            copy = value
        elif isinstance(value, dict):
            copy = {}
            for key, item in value.items():
                stored_key = _stored_key(key)
                if stored_key in copy:
                    raise RecordTypeError(f"map key {key!r} ({type(key).__name__}) is stored as {stored_key!r}, a key the map already has")
                copy[stored_key] = None
                pending.append((copy, stored_key, item, depth + 1))
        elif isinstance(value, (list, tuple)):
            copy = [None] * len(value)
            pending.extend((copy, index, item, depth + 1) for index, item in enumerate(value))
        elif isinstance(value, memoryview) and not value.c_contiguous:
            copy = value.tobytes()
        else:
            copy = value
        container[slot] = copy
    return root[0]


def _stored_key(key: Any) -> str | int:
    if isinstance(key, np.integer):
        return int(key)
    if isinstance(key, (str, int)) and not isinstance(key, bool):
        return key
    raise RecordTypeError(f"map key {key!r} of type {type(key).__name__} cannot be stored: map keys must be str or int")


def _msgpack_ext_hook(code: int, data: bytes) -> Any:
    if code != ARRAY_EXT_TYPE:
        raise ValueError(f"unknown msgpack extension type {code}")
    return _unpack_array(data)


def _packed_dtypes() -> tuple[tuple[np.dtype, bytes], ...]:
    """The dtypes whose arrays the C extension packs (`speedups.msgpack_pack`), each with its stored name: numpy's
    own instance of each allowed dtype that is its little-endian form (none on a big-endian machine), but not
    ``|b1``, whose bytes must be checked. An array of another dtype, or of an equal dtype that is another instance,
    is packed by the Python path, to the same bytes."""
    pairs = []
    for name in ALLOWED_DTYPES:
        native = np.dtype(np.dtype(name).name)
        if native == np.dtype(name) and native.kind != "b":
            pairs.append((native, name.encode("ascii")))
    return tuple(pairs)


_PACKED_DTYPES = _packed_dtypes()


class MsgpackCodec(Codec):
    """Structured samples; numpy arrays and scalars decode as read-only arrays.

    Records of plain types (exact dicts, lists, str, bytes, int, float, bool, None and contiguous arrays) are packed
    by the C extension where it is built, to the bytes the Python path packs and checks (tests/test_speedups_pack.py);
    it leaves any other record, and any it is not sure a reader accepts, to the Python path."""

    id, name = 3, "msgpack"

    def encode(self, record: Any) -> bytes:
        if speedups is not None:
            payload = speedups.msgpack_pack(record, np.ndarray, _PACKED_DTYPES)
            if payload is not None:
                return payload
        return self._encode_in_python(record)

    def encode_many(self, records: list[Any]) -> list[bytes]:
        if speedups is None:
            return super().encode_many(records)
        payloads = speedups.msgpack_pack_each(records, np.ndarray, _PACKED_DTYPES)
        if None in payloads:
            payloads = [self._encode_in_python(record) if payload is None else payload
                        for record, payload in zip(records, payloads)]
        return payloads

    def _encode_in_python(self, record: Any) -> bytes:
        """`record` packed by msgpack and checked as a reader checks it, or refused with what makes it unreadable."""
        try:
            try:
                return _packed(record)
            except (TypeError, ValueError, BufferError):  # rare: pack what readers return equal, or name the culprit
                return _packed(_normalised(record))
        except RecordTypeError:
            raise
        except (TypeError, ValueError, OverflowError, BufferError) as error:
            raise RecordTypeError(f"record cannot be encoded with msgpack: {error}") from None

    def decode(self, buffer: Any, start: int, end: int) -> Any:
        payload = bytes(buffer[start:end])  # no copy from a map; from a memoryview, keys must slice to hashable bytes
        check_msgpack(payload, ARRAY_EXT_TYPE)
        return msgpack.unpackb(payload, raw=False, strict_map_key=False, ext_hook=_msgpack_ext_hook, use_list=True)


_BY_NAME: dict[str, type[Codec]] = {codec.name: codec for codec in (BytesCodec, StrCodec, NdarrayCodec, MsgpackCodec)}
_BY_ID: dict[int, type[Codec]] = {codec.id: codec for codec in _BY_NAME.values()}
CODEC_NAMES = tuple(_BY_NAME)


def make_codec(name: str, *, dtype: Any = None, shape: Sequence[int] | None = None) -> Codec:
    """The codec a writer was asked for by name; `dtype` and `shape` belong to ``ndarray`` only."""
    if name not in _BY_NAME:
        raise RecordTypeError(f"unknown codec {name!r}; choose one of {', '.join(CODEC_NAMES)}")
    if name == "ndarray":
        if dtype is None:
            raise RecordTypeError('the ndarray codec needs a dtype, e.g. dtype="uint16"')
        return NdarrayCodec(dtype, shape or ())
    if dtype is not None or shape:
        raise RecordTypeError(f"dtype and shape apply to the ndarray codec, not {name!r}")
    return _BY_NAME[name]()


def codec_from_stored(codec: int | str, params: dict[str, Any], *, path: str) -> Codec:
    """Rebuild the codec recorded in a shard header (by id) or a manifest (by name), validating its parameters."""
    codec_id = _BY_NAME[codec].id if isinstance(codec, str) and codec in _BY_NAME else codec
    if codec_id not in _BY_ID:
        raise FormatError(f"unknown codec {codec!r}; known: {', '.join(CODEC_NAMES)}", path=path)
    codec_class = _BY_ID[codec_id]
    _check_param_names(codec_class, params, path=path)
    if codec_class is not NdarrayCodec:
        return codec_class()
    dtype = _dtype_from_stored(params["dtype"], path=path)
    shape = params["shape"]
    if not isinstance(shape, list):
        raise FormatError(f"stored trailing shape {shape!r} must be a JSON array", path=path)
    try:
        return NdarrayCodec(dtype, shape)
    except RecordTypeError as error:
        raise FormatError(f"stored codec parameters are impossible: {error}", path=path) from None


def _check_param_names(codec: type[Codec], params: Any, *, path: str) -> None:
    """Refuse stored parameters whose members are not exactly the codec's (spec §2): a "shape" lost to a flipped
    byte must not read as [] and turn rows into 1-D records, nor may ndarray parameters ride on a bytes shard."""
    expected = ", ".join(map(repr, codec.param_names)) or "none"
    if not isinstance(params, dict):
        raise FormatError(f"{codec.name} codec parameters must be an object, not {type(params).__name__}", path=path)
    for name in codec.param_names:
        if name not in params:
            raise FormatError(f"{codec.name} codec parameters lack the member {name!r}; expected exactly {expected}", path=path)
    for name in params:
        if name not in codec.param_names:
            raise FormatError(f"{codec.name} codec parameters have the unknown member {name!r}; expected exactly {expected}", path=path)

"""Codecs turn Python records into payload bytes and back; a shard records its codec so reads decode unaided.

Four codecs, each with a fixed id in the index header:

- ``bytes`` (0): the payload is the record.
- ``str`` (1): UTF-8 text.
- ``ndarray`` (2): one dtype and optional fixed trailing shape per shard; a record
  of shape ``(L, *shape)`` is its C-order little-endian elements, and reads are
  zero-copy read-only views of the map.
- ``msgpack`` (3): structured samples (dicts, lists, str, int, float, bool, None,
  bytes, numpy arrays). Arrays and numpy scalars use msgpack extension type 1.

Nothing here ever pickles or evaluates.
"""

from __future__ import annotations

import math
import struct
from typing import Any, Callable, Sequence

import msgpack
import numpy as np

from .errors import FormatError, RecordTypeError
from .msgpack_check import check_msgpack

ARRAY_EXT_TYPE = 1
MAX_ARRAY_DIMS = 32

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


def _dtype_from_stored(text: Any, *, path: str) -> np.dtype:
    if not isinstance(text, str) or text not in ALLOWED_DTYPES:
        raise FormatError(f"stored dtype {text!r} is not one of {', '.join(ALLOWED_DTYPES)}", path=path)
    return np.dtype(text)


class Codec:
    """Base of the four codecs: `encode` gives a bytes-like payload, `decode` reads one from a buffer."""

    id: int
    name: str

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


class BytesCodec(Codec):
    id, name = 0, "bytes"

    def encode(self, record: Any) -> bytes | bytearray | memoryview:
        if isinstance(record, (bytes, bytearray)):
            return record
        if isinstance(record, memoryview):
            return record.cast("B") if record.contiguous else record.tobytes()
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

    def __init__(self, dtype: Any, shape: Sequence[int] = ()) -> None:
        self.dtype = canonical_dtype(dtype)
        self.shape = tuple(int(dim) for dim in shape)
        if any(dim < 1 for dim in self.shape) or len(self.shape) >= MAX_ARRAY_DIMS:
            raise RecordTypeError(f"trailing shape {self.shape} must be fewer than {MAX_ARRAY_DIMS} positive sizes")
        self.row_size = self.dtype.itemsize * math.prod(self.shape)

    def params(self) -> dict[str, Any]:
        return {"dtype": self.dtype.str, "shape": list(self.shape)}

    def encode(self, record: Any) -> memoryview:
        array = np.asarray(record)
        if array.ndim != 1 + len(self.shape) or array.shape[1:] != self.shape:
            raise RecordTypeError(f"record of shape {array.shape} does not fit the shard's shape (L, *{self.shape})")
        array = _cast_exactly(array, self.dtype)
        return memoryview(np.ascontiguousarray(array).reshape(-1).view(np.uint8))  # type: ignore[arg-type]

    def decode(self, buffer: Any, start: int, end: int) -> np.ndarray:
        return self.decoder_for(buffer)(buffer, start, end)

    def rows(self, buffer: Any) -> np.ndarray:
        """The whole buffer as one read-only array of rows; it must hold a whole number of rows."""
        if len(buffer) % self.row_size:
            raise ValueError(f"{len(buffer)} bytes are not a whole number of {self.row_size}-byte rows")
        return np.frombuffer(buffer, self.dtype).reshape((-1, *self.shape))

    def decoder_for(self, buffer: Any) -> Callable[[Any, int, int], np.ndarray]:
        """Records become slices of one array over the whole map: a view each, no per-record frombuffer."""
        rows, row_size = self.rows(buffer), self.row_size

        def decode(_buffer: Any, start: int, end: int) -> np.ndarray:
            if start % row_size or end % row_size:
                raise ValueError(f"offsets [{start}, {end}) are not on {row_size}-byte row boundaries")
            return rows[start // row_size : end // row_size]

        return decode


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
        return array.astype(dtype)
    raise RecordTypeError(f"records of dtype {array.dtype} cannot be stored as {dtype} without changing values")


def _pack_array(array: np.ndarray) -> msgpack.ExtType:
    dtype = canonical_dtype(array.dtype)
    if array.ndim >= MAX_ARRAY_DIMS:
        raise RecordTypeError(f"arrays may have at most {MAX_ARRAY_DIMS - 1} dimensions, not {array.ndim}")
    name = dtype.str.encode("ascii")
    head = bytes([len(name)]) + name + bytes([array.ndim]) + struct.pack(f"<{array.ndim}Q", *array.shape)
    body = np.ascontiguousarray(array, dtype=dtype).tobytes()
    return msgpack.ExtType(ARRAY_EXT_TYPE, head + body)


_DTYPES_BY_NAME = {name.encode("ascii"): np.dtype(name) for name in ALLOWED_DTYPES}
_SHAPES = [struct.Struct(f"<{ndim}Q") for ndim in range(MAX_ARRAY_DIMS)]


def _unpack_array(data: bytes) -> np.ndarray:
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
    return np.frombuffer(data, dtype, offset=body_start).reshape(shape)


def _msgpack_default(value: Any) -> Any:
    if isinstance(value, (np.ndarray, np.generic)):
        return _pack_array(np.asarray(value))
    raise RecordTypeError(f"the msgpack codec cannot encode {type(value).__name__}")


def _msgpack_ext_hook(code: int, data: bytes) -> Any:
    if code != ARRAY_EXT_TYPE:
        raise ValueError(f"unknown msgpack extension type {code}")
    return _unpack_array(data)


class MsgpackCodec(Codec):
    """Structured samples; numpy arrays and scalars decode as read-only arrays."""

    id, name = 3, "msgpack"

    def encode(self, record: Any) -> bytes:
        try:
            payload = msgpack.packb(record, default=_msgpack_default, use_bin_type=True, datetime=False)
            check_msgpack(payload, ARRAY_EXT_TYPE)  # e.g. a msgpack.Timestamp or ExtType inside: readers refuse those
        except RecordTypeError:
            raise
        except (TypeError, ValueError, OverflowError) as error:
            raise RecordTypeError(f"record cannot be encoded with msgpack: {error}") from None
        return payload

    def decode(self, buffer: Any, start: int, end: int) -> Any:
        payload = buffer[start:end]
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
    if codec_id != NdarrayCodec.id:
        return _BY_ID[codec_id]()
    dtype = _dtype_from_stored(params.get("dtype"), path=path)
    shape = params.get("shape", [])
    if (
        not isinstance(shape, list)
        or len(shape) >= MAX_ARRAY_DIMS
        or not all(type(dim) is int and 1 <= dim < (1 << 32) for dim in shape)
    ):
        raise FormatError(f"stored trailing shape {shape!r} must be a list of positive integers below 2**32", path=path)
    return NdarrayCodec(dtype, shape)

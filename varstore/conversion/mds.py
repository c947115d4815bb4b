"""MosaicML MDS folders (``index.json`` and its ``.mds`` shards) as a source, read from its documented layout.

An MDS shard is ``uint32 samples``, ``samples + 1`` uint32 offsets of each sample from the file's start, the
shard's JSON config, then the samples; a sample is the uint32 sizes of its variable-size columns, then each
column's bytes in the order of ``column_names`` (MDS's ``mds/writer.py``). A compressed shard (``zip_data``) is
that file compressed whole. Each sample becomes a msgpack map of its columns: ``bytes`` as bytes, ``str`` as
str, the integer and float encodings (and ``str_int``, ``str_float``) as numbers, ``ndarray`` as a numpy array
(its dtype and shape from the encoding or from the sample's own header), ``json`` as its value, ``jpeg`` and
``png`` as the encoded image bytes, ``pil`` (raw pixels) as PNG bytes of the same pixels (through Pillow),
``list[jpeg]``, ``list[png]``, ``list[pil]`` and ``jpeg_array`` as lists of those, ``str_decimal`` as its text.
``pkl`` columns are refused unless `allow_pickle` (unpickling runs code the file chooses). Every size and offset
is checked against the file before it is used: a hostile or damaged shard is refused with its file and sample
named, never read out of bounds.
"""

from __future__ import annotations

import bz2
import gzip
import json
import mmap
import os
import pickle
import struct
import tempfile
from collections.abc import Callable
from typing import Any, BinaryIO

import numpy as np

from ..dataset.writer import ShardedWriter
from ..errors import CommandError, require_extra
from ..progress import Counter
from .raw_images import RawImageError, png_of_raw_pixels
from .source_base import Source, append_record, even_parts, read_index_json

_READ_BYTES = 1 << 20
_FIXED = {"int": "<i8", "int8": "<i1", "int16": "<i2", "int32": "<i4", "int64": "<i8", "uint8": "<u1",
          "uint16": "<u2", "uint32": "<u4", "uint64": "<u8", "float16": "<f2", "float32": "<f4", "float64": "<f8"}
# The dtype codes of an ndarray's own header (MDS's NDArray._int2value_dtype), and of its shape's integers.
_ARRAY_DTYPES = {8: "uint8", 9: "int8", 16: "uint16", 17: "int16", 18: "float16", 32: "uint32", 33: "int32",
                 34: "float32", 64: "uint64", 65: "int64", 66: "float64"}
_SHAPE_DTYPES = {0: "<u1", 1: "<u2", 2: "<u4", 3: "<u8"}
_TEXT = {"str": str, "str_int": int, "str_float": float, "str_decimal": str}
_ENCODED_IMAGES = ("jpeg", "png")
# The image lists: MDS's List (a uint32 left 0 for future use, then what JPEGArray holds) and JPEGArray (uint32
# count, count uint32 sizes, the images), each image as its element encoding stores it.
_IMAGE_LISTS = {"list[jpeg]": ("jpeg", True), "list[png]": ("png", True), "list[pil]": ("pil", True),
                "jpeg_array": ("jpeg", False), "jpegarray": ("jpeg", False)}
_DECOMPRESSED = ("zstd", "gz", "bz2")
_NOT_DECOMPRESSED = ("br", "snappy")


class _SampleError(ValueError):
    """A column value that does not decode; the caller names the shard and sample."""


def _column_decoder(encoding: Any, where: str, allow_pickle: bool) -> tuple[Callable[[bytes], Any], int | None]:
    """(decode one value's bytes, the fixed size of a value or None) for an MDS column `encoding`."""
    if not isinstance(encoding, str):
        raise CommandError(f"{where}: a column encoding {encoding!r} that is not a string")
    if encoding in _FIXED:
        dtype = np.dtype(_FIXED[encoding])
        return (lambda data: np.frombuffer(data, dtype)[0].item()), dtype.itemsize
    if encoding == "bytes" or encoding in _ENCODED_IMAGES:
        return (lambda data: data), None
    if encoding == "pil":
        return _png_of_raw, None
    if encoding in _IMAGE_LISTS:
        return _image_list_decoder(*_IMAGE_LISTS[encoding]), None
    if encoding in _TEXT:
        return _text_decoder(_TEXT[encoding]), None
    if encoding == "json":
        return _json_value, None
    if encoding == "ndarray" or encoding.startswith("ndarray:"):
        return _array_decoder(encoding, where)
    if encoding == "pkl":
        if not allow_pickle:
            raise CommandError(f"{where}: a pkl column; unpickling runs whatever code the file holds, so convert "
                               "refuses it unless asked (--allow-pickle, allow_pickle=True) for a file you trust")
        return (lambda data: pickle.loads(data)), None
    raise CommandError(f"{where}: {encoding!r} is not an MDS column encoding")


def _png_of_raw(data: bytes) -> bytes:
    try:
        return png_of_raw_pixels(data, "mds")
    except RawImageError as error:
        raise _SampleError(str(error)) from None


def _image_list_decoder(element: str, reserved_word: bool) -> Callable[[bytes], list[bytes]]:
    """A list of images (each as its `element` encoding's column gives it), after a reserved uint32 if
    `reserved_word`; the sizes must add up to exactly the bytes that follow them."""
    image: Callable[[bytes], bytes] = _png_of_raw if element == "pil" else (lambda value: value)

    def decode(data: bytes) -> list[bytes]:
        at = 4 if reserved_word else 0
        if len(data) < at + 4:
            raise _SampleError(f"a list of {element} images of {len(data)} bytes, shorter than its header")
        if reserved_word and data[:4] != bytes(4):
            raise _SampleError(f"a list of {element} images whose reserved first word is {data[:4].hex()}, not 0")
        (count,) = struct.unpack_from("<I", data, at)
        at += 4
        if at + 4 * count > len(data):
            raise _SampleError(f"a list of {count:,} {element} images whose sizes run past its {len(data):,} bytes")
        sizes = struct.unpack_from(f"<{count}I", data, at)
        at += 4 * count
        if at + sum(sizes) != len(data):
            raise _SampleError(f"a list of {count:,} {element} images of {sum(sizes):,} bytes after its header, "
                               f"and {len(data) - at:,} follow it")
        images = []
        for size in sizes:
            images.append(image(data[at : at + size]))
            at += size
        return images

    return decode


def _text_decoder(parse: Callable[[str], Any]) -> Callable[[bytes], Any]:
    def decode(data: bytes) -> Any:
        try:
            return parse(data.decode("utf-8"))
        except ValueError as error:  # UnicodeDecodeError, a number that does not parse
            raise _SampleError(f"not {'UTF-8 text' if parse is str else f'a {parse.__name__} as text'}: {error}") from None
    return decode


def _json_value(data: bytes) -> Any:
    try:
        return json.loads(data.decode("utf-8"))
    except ValueError as error:
        raise _SampleError(f"not JSON: {error}") from None
    except RecursionError:
        raise _SampleError("JSON nested too deeply to read") from None


def _array_decoder(encoding: str, where: str) -> tuple[Callable[[bytes], Any], int | None]:
    """An ndarray column: ``ndarray``, ``ndarray:DTYPE`` or ``ndarray:DTYPE:D1,D2...``; whatever the encoding
    leaves out, each value's header gives (a dtype code byte, then a byte of ndim << 2 | shape-integer width)."""
    parts = encoding.split(":")[1:]
    try:
        if len(parts) > 2 or (parts and parts[0] not in _ARRAY_DTYPES.values()):
            raise ValueError("expected ndarray[:DTYPE[:SHAPE]]")
        dtype = np.dtype(parts[0]).newbyteorder("<") if parts else None
        shape = tuple(int(dim) for dim in parts[1].split(",")) if len(parts) == 2 else None
        if shape is not None and min(shape) < 1:
            raise ValueError("a dimension below 1")
    except (ValueError, TypeError) as error:
        raise CommandError(f"{where}: the column encoding {encoding!r} is not an MDS ndarray encoding: {error}") from None
    fixed = None if dtype is None or shape is None else int(np.prod(shape)) * dtype.itemsize

    def decode(data: bytes) -> np.ndarray:
        at, value_dtype, value_shape = 0, dtype, shape
        if value_dtype is None:
            if len(data) < 1 or data[0] not in _ARRAY_DTYPES:
                raise _SampleError(f"an ndarray whose dtype code {data[0] if len(data) else 'is missing'} is not MDS's")
            value_dtype, at = np.dtype(_ARRAY_DTYPES[data[0]]).newbyteorder("<"), 1
        if value_shape is None:
            if len(data) < at + 1:
                raise _SampleError("an ndarray without its shape byte")
            ndim, width = data[at] >> 2, np.dtype(_SHAPE_DTYPES[data[at] & 3])
            if len(data) < at + 1 + ndim * width.itemsize:
                raise _SampleError(f"an ndarray of {ndim} dimensions with fewer bytes than its shape")
            value_shape = tuple(np.frombuffer(data, width, ndim, at + 1).tolist())
            at += 1 + ndim * width.itemsize
        elements = 1
        for dim in value_shape:
            elements *= dim
        if elements * value_dtype.itemsize != len(data) - at:
            raise _SampleError(f"an ndarray of shape {value_shape} {value_dtype.name} needs "
                               f"{elements * value_dtype.itemsize:,} bytes, and {len(data) - at:,} follow its header")
        return np.frombuffer(data, value_dtype, elements, at).reshape(value_shape).copy()

    return decode, fixed


def _entry_value(entry: dict[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    value = entry.get(key)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise CommandError(f"{where}: {key!r} is {value!r}, not what MDS writes there")
    return value


class _Shard:
    """One shard of index.json, its columns and files checked against the folder."""

    def __init__(self, folder: str, entry: Any, position: int, allow_pickle: bool) -> None:
        where = f"{os.path.join(folder, 'index.json')}, shard {position}"
        if not isinstance(entry, dict):
            raise CommandError(f"{where}: not a map")
        if entry.get("format") != "mds" or entry.get("version") != 2:
            raise CommandError(f"{where}: format {entry.get('format')!r} version {entry.get('version')!r}; "
                               "convert reads MDS shards of version 2")
        names = _entry_value(entry, "column_names", list, where)
        encodings = _entry_value(entry, "column_encodings", list, where)
        sizes = _entry_value(entry, "column_sizes", list, where)
        if not len(names) == len(encodings) == len(sizes) or not all(isinstance(name, str) for name in names):
            raise CommandError(f"{where}: column_names, column_encodings and column_sizes differ in length or type")
        self.names = names
        self.decoders: list[Callable[[bytes], Any]] = []
        self.fixed: list[int | None] = []
        for name, encoding, size in zip(names, encodings, sizes):
            decoder, fixed = _column_decoder(encoding, f"{where}, column {name!r}", allow_pickle)
            if size != fixed:
                raise CommandError(f"{where}, column {name!r}: column_sizes says {size!r}, but {encoding} values are "
                                   f"{'of ' + str(fixed) + ' bytes' if fixed else 'of varying size'}")
            self.decoders.append(decoder)
            self.fixed.append(fixed)
        # A sample's header: the uint32 size of each variable-size column.
        self.sizes = struct.Struct(f"<{sum(1 for fixed in self.fixed if fixed is None)}I")
        self.samples = _entry_value(entry, "samples", int, where)
        raw = _entry_value(entry, "raw_data", dict, where)
        self.raw_bytes = _entry_value(raw, "bytes", int, f"{where}, raw_data")
        self.compression = entry.get("compression")
        if self.compression is None:
            self.path = _file_in(folder, _entry_value(raw, "basename", str, f"{where}, raw_data"), where)
            self.algorithm, stored = None, self.raw_bytes
        else:
            if not isinstance(self.compression, str):
                raise CommandError(f"{where}: compression {self.compression!r} is not a string")
            self.algorithm = self.compression.split(":")[0]
            if self.algorithm not in _DECOMPRESSED:
                named = " (MDS's brotli and snappy are not read: rewrite the shards with zstd)" \
                    if self.algorithm in _NOT_DECOMPRESSED else ""
                raise CommandError(f"{where}: compression {self.compression!r}{named}; convert reads "
                                   f"{', '.join(_DECOMPRESSED)}")
            zipped = _entry_value(entry, "zip_data", dict, where)
            self.path = _file_in(folder, _entry_value(zipped, "basename", str, f"{where}, zip_data"), where)
            stored = _entry_value(zipped, "bytes", int, f"{where}, zip_data")
        size = os.path.getsize(self.path)
        if size != stored:
            raise CommandError(f"{self.path}: {size:,} bytes, and index.json says {stored:,}")
        if self.samples < 0 or 4 * (self.samples + 2) > self.raw_bytes:
            raise CommandError(f"{self.path}: index.json says {self.samples:,} samples in {self.raw_bytes:,} bytes, "
                               "fewer than their offsets take")

    def samples_of(self) -> Any:
        """(sample position in the shard, its columns as a map) of every sample, read from the file's map."""
        with self._opened() as file:
            if self.raw_bytes == 0:
                return
            with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
                yield from self._parsed(mapped)

    def _opened(self) -> BinaryIO:
        if self.algorithm is None:
            return open(self.path, "rb")
        return _decompressed(self.path, self.algorithm, self.raw_bytes)

    def _parsed(self, mapped: mmap.mmap) -> Any:
        """The samples of the mapped shard; each is copied out of the map (a slice) before it is decoded."""
        size = len(mapped)
        if size != self.raw_bytes:
            raise CommandError(f"{self.path}: {size:,} bytes, and index.json says {self.raw_bytes:,}")
        (count,) = struct.unpack_from("<I", mapped, 0)
        if count != self.samples:
            raise CommandError(f"{self.path}: holds {count:,} samples, and index.json says {self.samples:,}")
        offsets = np.frombuffer(mapped[4 : 4 * (count + 2)], "<u4").astype(np.int64)
        if offsets[0] < 4 * (count + 2) or offsets[-1] != size or (np.diff(offsets) < 0).any():
            raise CommandError(f"{self.path}: its sample offsets ({offsets[0]} to {offsets[-1]}) are not "
                               f"increasing from after its header to its end ({size:,} bytes)")
        for position in range(count):
            start, stop = int(offsets[position]), int(offsets[position + 1])
            try:
                yield position, self._sample(mapped[start:stop])
            except _SampleError as error:
                raise CommandError(f"{self.path}, sample {position}: {error}") from None

    def _sample(self, data: bytes) -> dict[str, Any]:
        header = self.sizes.size
        if len(data) < header:
            raise _SampleError(f"{len(data)} bytes, fewer than the sizes of its {header // 4} variable columns")
        sizes = iter(self.sizes.unpack_from(data))
        lengths = [next(sizes) if fixed is None else fixed for fixed in self.fixed]
        if header + sum(lengths) != len(data):
            raise _SampleError(f"its columns' sizes {lengths} and their header add up to "
                               f"{header + sum(lengths):,} bytes, not its {len(data):,}")
        sample, at = {}, header
        for name, decoder, length in zip(self.names, self.decoders, lengths):
            try:
                sample[name] = decoder(data[at : at + length])
            except _SampleError as error:
                raise _SampleError(f"column {name!r}: {error}") from None
            except (pickle.UnpicklingError, EOFError, AttributeError, ImportError) as error:
                raise _SampleError(f"column {name!r}: does not unpickle: {error!r}") from None
            at += length
        return sample


def _file_in(folder: str, basename: str, where: str) -> str:
    """The file `basename` names inside `folder`, refused if it would lie outside or does not exist."""
    if os.path.isabs(basename) or ".." in basename.replace("\\", "/").split("/"):
        raise CommandError(f"{where}: the shard file {basename!r} lies outside {folder}")
    path = os.path.join(folder, basename)
    if not os.path.isfile(path):
        raise CommandError(f"{where}: its shard file {path} is missing")
    return path


def _decompressed(path: str, algorithm: str, expected: int) -> BinaryIO:
    """A temporary file holding the shard at `path` decompressed, read in pieces: memory stays constant, and a file
    that decompresses to more than the `expected` bytes index.json declares is refused once it passes them."""
    output = tempfile.TemporaryFile()  # noqa: SIM115 (returned open, for the caller to close)
    try:
        with open(path, "rb") as compressed:
            reader: Any
            if algorithm == "zstd":
                zstandard = require_extra("zstandard", "mds", "converting zstd-compressed MDS shards")
                errors: tuple[type[BaseException], ...] = (zstandard.ZstdError, OSError, EOFError)
                reader = zstandard.ZstdDecompressor().stream_reader(compressed, read_across_frames=True)
            else:
                errors = (OSError, EOFError)
                reader = gzip.GzipFile(fileobj=compressed) if algorithm == "gz" else bz2.BZ2File(compressed)
            written = 0
            try:
                while chunk := reader.read(_READ_BYTES):
                    written += len(chunk)
                    if written > expected:
                        raise CommandError(f"{path}: decompresses to more than the {expected:,} bytes index.json says")
                    output.write(chunk)
            except errors as error:
                raise CommandError(f"{path}: not a whole {algorithm} stream: {error}") from None
        if written != expected:
            raise CommandError(f"{path}: decompresses to {written:,} bytes, and index.json says {expected:,}")
        output.flush()
        output.seek(0)
        return output  # type: ignore[return-value]
    except BaseException:
        output.close()
        raise


class MdsSource(Source):
    """An MDS folder: its shards in index.json's order, every sample a msgpack map of its columns."""

    codec = "msgpack"
    unit = "sample"

    def __init__(self, path: str, *, allow_pickle: bool) -> None:
        self.path = path
        index_path = os.path.join(path, "index.json")
        index = read_index_json(path, "an MDS")
        if not isinstance(index, dict) or index.get("version") != 2 or not isinstance(index.get("shards"), list):
            raise CommandError(f"{index_path}: not an MDS index of version 2 (a map with its list of shards)")
        self.shards = [_Shard(path, entry, position, allow_pickle) for position, entry in enumerate(index["shards"])]
        self.total = sum(shard.samples for shard in self.shards)

    def whole(self) -> dict[str, Any]:
        return {"first": 0, "stop": len(self.shards)}

    def split(self, count: int) -> list[dict[str, Any]]:
        """Parts of consecutive shards."""
        return even_parts(count, len(self.shards))

    def write_part(self, writer: ShardedWriter, progress: Counter, part: dict[str, Any]) -> None:
        for shard in self.shards[part["first"] : part["stop"]]:
            for position, sample in shard.samples_of():
                append_record(writer, sample, f"{shard.path}, sample {position}")
            progress(shard.samples)


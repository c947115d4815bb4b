"""litdata chunk folders (``index.json`` and its ``chunk-*.bin`` files) as a source, read from their layout.

A chunk written by litdata's PyTreeLoader is ``uint32 items``, ``items + 1`` uint32 offsets of each item from the
file's start, then the items; an item is the uint32 sizes of its leaves, then each leaf's bytes, the leaves being
those of the sample's pytree (``config.data_spec``, in torch's pytree JSON) in ``config.data_format``'s
serializers (litdata's ``streaming/writer.py``, ``item_loader.py``, ``serializers.py``). With zstd compression a
chunk is compressed whole (``compression_level`` "chunk", files ``chunk-*.zstd.bin``), in frames of items
(``batch``: the ``LDFZ01`` layout of ``framed_zstd.py``) or item by item (``sample``). Each sample becomes a
msgpack record of its pytree rebuilt (dicts, lists; tuples as lists): ``int``, ``float`` and ``bool`` as
numbers, ``str`` and ``text`` as str, ``bytes`` as bytes, ``numpy``, ``no_header_numpy``, ``tensor`` and
``no_header_tensor`` as numpy arrays, ``jpeg`` and ``image`` as the encoded image's bytes, ``pil`` (raw pixels)
as PNG bytes, encoded without loss through Pillow, ``json`` (its binary nesting or JSON text) as its value, and
the serializers that keep a file's bytes (video, audio, pdf, file...) as those bytes. ``pickle`` leaves are
refused unless `allow_pickle`.
A chunk of dict samples whose items litdata keeps only as Arrow rows (its ``LDARW01`` footer: an Arrow IPC file)
is read through pyarrow, each row as the Hugging Face converter makes it (lists of numbers as arrays).
Every size and offset is checked against its file before it is used; errors name the chunk file and item.
"""

from __future__ import annotations

import json
import mmap
import os
import pickle
import struct
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from ..dataset.writer import ShardedWriter
from ..errors import CommandError, require_extra
from ..progress import Counter
from .huggingface import column_values
from .raw_images import RawImageError, png_of_raw_pixels
from .source_base import Source, append_record, even_parts, read_index_json

_READ_BYTES = 1 << 20
# litdata's constants.py: _NUMPY_DTYPES_MAPPING (numbered in its _NUMPY_SCTYPES order) and _TORCH_DTYPES_MAPPING.
_NUMPY_DTYPES = {0: "|i1", 1: "<i2", 2: "<i4", 3: "<i8", 4: "|u1", 5: "<u2", 6: "<u4", 7: "<u8", 8: "<f2",
                 9: "<f4", 10: "<f8", 11: "<c8", 12: "<c16", 13: "|b1"}
_TORCH_DTYPES = {0: "<f4", 1: "<f4", 2: "<f8", 3: "<f8", 4: "<c8", 5: "<c8", 6: "<c16", 7: "<c16", 8: "<f2",
                 9: "<f2", 11: "|u1", 12: "|i1", 13: "<i2", 14: "<i2", 15: "<i4", 16: "<i4", 17: "<i8", 18: "<i8",
                 19: "|b1", 20: "<u2"}
_FIXED = {"int": (struct.Struct("<q"), 8), "float": (struct.Struct("<d"), 8)}
_FRAMED_MAGIC = b"LDFZ01\0\0"
_ARROW_FOOTER_MAGIC = b"LDARW01\0"
_FRAMED_PREFIX = struct.Struct("<8sHHIII")
_FRAME = struct.Struct("<IIQII")
# The serializers that store a file's bytes as they are (litdata's Video, Audio, Nifti, Mesh, PDF, TIFF, File).
_FILE_BYTES = ("video", "audio", "nifti", "mesh", "pdf", "tiff", "file")
_COUNT = struct.Struct("<I")
_NUMBER = {8: struct.Struct("<q"), 9: struct.Struct("<d")}
_RECORD_NUMBER = {0x12: struct.Struct("<q"), 0x13: struct.Struct("<d")}
_JSON_DEPTH = 200


class _ItemError(ValueError):
    """A leaf that does not decode; the caller names the chunk and item."""


def _leaf_decoder(name: Any, where: str, allow_pickle: bool) -> tuple[Callable[[bytes], Any], int | None]:
    """(decode one leaf's bytes, the fixed size of a leaf or None) for the serializer `name` of data_format."""
    if not isinstance(name, str):
        raise CommandError(f"{where}: a data_format entry {name!r} that is not a string")
    kind, _, argument = name.partition(":")
    if kind in _FIXED:
        layout, size = _FIXED[kind]
        return (lambda data: layout.unpack(data)[0]), size
    if kind == "bool":
        return _boolean, 1
    if kind in ("str", "text"):
        return _text, None
    if kind in ("bytes", "jpeg", "image", *_FILE_BYTES):
        return (lambda data: data), None
    if kind == "json":
        return _json_leaf, None
    if kind == "pil":
        return (lambda data: png_of_raw_pixels(data, "litdata")), None
    if kind in ("numpy", "tensor"):
        return (_numpy_array if kind == "numpy" else _tensor), None
    if kind in ("no_header_numpy", "no_header_tensor"):
        table = _NUMPY_DTYPES if kind == "no_header_numpy" else _TORCH_DTYPES
        if not argument.isdigit() or int(argument) not in table:
            raise CommandError(f"{where}: {name!r} names no dtype litdata numbers")
        dtype = np.dtype(table[int(argument)])
        return (lambda data: _flat_array(data, dtype, (len(data) // dtype.itemsize,))), None
    if kind == "pickle":
        if not allow_pickle:
            raise CommandError(f"{where}: a pickle leaf; unpickling runs whatever code the file holds, so convert "
                               "refuses it unless asked (--allow-pickle, allow_pickle=True) for a file you trust")
        return pickle.loads, None
    raise CommandError(f"{where}: the serializer {name!r} is not converted; the ones converted are int, float, "
                       "bool, str, text, bytes, jpeg, image, pil, numpy, no_header_numpy, tensor, no_header_tensor, "
                       f"json, {', '.join(_FILE_BYTES)} and pickle (with --allow-pickle)")


def _leaf_decoder_or_refusal(name: Any, where: str, allow_pickle: bool) -> tuple[Callable[[bytes], Any], int | None]:
    """`_leaf_decoder`'s, or for a serializer it refuses a decoder that raises that refusal when first called."""
    try:
        return _leaf_decoder(name, where, allow_pickle)
    except CommandError as error:
        refusal = error

    def refuse(data: bytes) -> Any:
        raise refusal

    return refuse, None


def _boolean(data: bytes) -> bool:
    if data not in (b"\0", b"\1"):
        raise _ItemError(f"a bool leaf holds {data!r}, not 0 or 1")
    return data == b"\1"


def _text(data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise _ItemError(f"a str leaf that is not UTF-8: {error}") from None


def _flat_array(data: bytes, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    elements = 1
    for dim in shape:
        elements *= dim
    if elements * dtype.itemsize != len(data):
        raise _ItemError(f"an array of shape {shape} {dtype.name} needs {elements * dtype.itemsize:,} bytes, "
                         f"and {len(data):,} are there")
    return np.frombuffer(data, dtype, elements).reshape(shape).copy()


def _numpy_array(data: bytes) -> np.ndarray:
    """litdata's NumpySerializer: uint32 dtype number, uint32 rank, uint32 dimensions, the values."""
    return _shaped_leaf(data, "<", _NUMPY_DTYPES, "a numpy leaf")


def _tensor(data: bytes) -> np.ndarray:
    """litdata's TensorSerializer: big-endian uint32 dtype number and rank, then dimensions, then the values."""
    return _shaped_leaf(data, ">", _TORCH_DTYPES, "a tensor leaf")


def _shaped_leaf(data: bytes, order: str, dtypes: dict[int, Any], what: str) -> np.ndarray:
    """An array stored as a uint32 dtype number (a key of `dtypes`), a uint32 rank and the dimensions, in byte
    `order`, then the values."""
    if len(data) < 8:
        raise _ItemError(f"{what} shorter than its header")
    code, rank = struct.unpack_from(f"{order}II", data)
    if code not in dtypes or len(data) < 8 + 4 * rank:
        raise _ItemError(f"{what} with dtype number {code} and rank {rank} that its bytes do not hold")
    shape = struct.unpack_from(f"{order}{rank}I", data, 8)
    return _flat_array(data[8 + 4 * rank :], np.dtype(dtypes[code]), shape)


def _json_leaf(data: bytes) -> Any:
    """litdata's JsonSerializer: JSON text (its first byte above 0x20), or its tagged binary nesting (a tag byte,
    then a value's bytes: lists of one type packed, dicts and lists of same-keyed records), read to its last byte."""
    if data and data[0] > 0x20:
        return _json_text(data)
    try:
        value, end = _nested(data, 0, 0)
    except (struct.error, IndexError):
        raise _ItemError(f"a json leaf whose sizes run past its {len(data):,} bytes") from None
    if end != len(data):
        raise _ItemError(f"a json leaf of {len(data):,} bytes whose value ends at byte {end:,}")
    return value


def _json_text(data: bytes) -> Any:
    try:
        return json.loads(data.decode("utf-8"))
    except ValueError as error:
        raise _ItemError(f"a json leaf that is not JSON: {error}") from None
    except RecursionError:
        raise _ItemError("a json leaf nested too deeply to read") from None


def _utf8_at(data: bytes, at: int) -> tuple[str, int]:
    (length,) = _COUNT.unpack_from(data, at)
    at += 4
    if at + length > len(data):
        raise _ItemError(f"a json leaf whose text of {length:,} bytes at byte {at:,} runs past its end")
    try:
        return data[at : at + length].decode("utf-8"), at + length
    except UnicodeDecodeError as error:
        raise _ItemError(f"a json leaf whose text is not UTF-8: {error}") from None


def _packed(data: bytes, at: int, count: int, dtype: str) -> tuple[list[Any], int]:
    end = at + count * np.dtype(dtype).itemsize
    if end > len(data):
        raise _ItemError(f"a json leaf whose {count:,} packed values at byte {at:,} run past its end")
    return np.frombuffer(data, dtype, count, at).tolist(), end


def _nested(data: bytes, at: int, depth: int) -> tuple[Any, int]:
    """(the value whose tag is at byte `at`, where it ends) of a json leaf's binary nesting."""
    if depth > _JSON_DEPTH:
        raise _ItemError(f"a json leaf nested more than {_JSON_DEPTH} deep")
    tag = data[at]
    if tag == 11:
        return None, at + 1
    if tag == 10:
        return _json_bool(data[at + 1]), at + 2
    if tag in _NUMBER:
        return _NUMBER[tag].unpack_from(data, at + 1)[0], at + 9
    if tag == 7:
        return _utf8_at(data, at + 1)
    if tag > 6:
        raise _ItemError(f"a json leaf with the tag {tag} at byte {at:,}, not one litdata writes")
    (count,) = _COUNT.unpack_from(data, at + 1)
    at += 5
    if tag == 0:  # JSON text of `count` bytes
        if at + count > len(data):
            raise _ItemError(f"a json leaf whose JSON text of {count:,} bytes runs past its end")
        return _json_text(data[at : at + count]), at + count
    if tag == 1:
        texts = []
        for _ in range(count):
            text, at = _utf8_at(data, at)
            texts.append(text)
        return texts, at
    if tag in (2, 3):
        return _packed(data, at, count, "<i8" if tag == 2 else "<f8")
    if tag == 4:
        if at + count > len(data):
            raise _ItemError(f"a json leaf whose {count:,} booleans run past its end")
        return [_json_bool(flag) for flag in data[at : at + count]], at + count
    if tag == 5:
        mapping = {}
        for _ in range(count):
            key, at = _utf8_at(data, at)
            mapping[key], at = _nested(data, at, depth + 1)
        return mapping, at
    (key_count,) = _COUNT.unpack_from(data, at)  # tag 6: `count` records of the same keys
    at += 4
    if key_count == 0:  # litdata writes records of at least one key; none would make `count` records of no bytes
        raise _ItemError(f"a json leaf of {count:,} records without keys")
    keys = []
    for _ in range(key_count):
        key, at = _utf8_at(data, at)
        keys.append(key)
    records = []
    for _ in range(count):
        record = {}
        for key in keys:
            kind, at = data[at], at + 1
            if kind == 0x10:
                record[key] = None
            elif kind == 0x11:
                record[key], at = _utf8_at(data, at)
            elif kind in _RECORD_NUMBER:
                record[key], at = _RECORD_NUMBER[kind].unpack_from(data, at)[0], at + 8
            elif kind == 0x14:
                record[key], at = _json_bool(data[at]), at + 1
            else:
                raise _ItemError(f"a json leaf with the record tag {kind} at byte {at - 1:,}, not one litdata writes")
        records.append(record)
    return records, at


def _json_bool(flag: int) -> bool:
    if flag > 1:
        raise _ItemError(f"a json leaf with a boolean of {flag}, not 0 or 1")
    return flag == 1


def _template(spec: Any, where: str) -> Any:
    """torch's pytree `spec` (as litdata's data_spec stores it) checked, as what `_rebuilt` builds from: None for a
    leaf, a list of child templates for a list or tuple, a (keys, child templates) pair for a dict."""
    if not isinstance(spec, dict) or not isinstance(spec.get("children_spec"), list):
        raise CommandError(f"{where}: a data_spec node that is not torch's pytree JSON")
    kind, children = spec.get("type"), [_template(child, where) for child in spec["children_spec"]]
    if kind is None:
        return None
    if kind in ("builtins.dict", "collections.OrderedDict"):
        try:
            keys = json.loads(spec["context"])
        except (TypeError, ValueError) as error:
            raise CommandError(f"{where}: a dict node whose context is not its JSON keys: {error}") from None
        if not isinstance(keys, list) or len(keys) != len(children):
            raise CommandError(f"{where}: a dict node with {len(children)} children and keys {keys!r}")
        return keys, children
    if kind in ("builtins.list", "builtins.tuple"):
        return children
    raise CommandError(f"{where}: a data_spec node of type {kind!r}; convert rebuilds dicts, lists and tuples")


def _leaf_count(template: Any) -> int:
    if template is None:
        return 1
    children = template[1] if isinstance(template, tuple) else template
    return sum(_leaf_count(child) for child in children)


def _rebuilt(template: Any, leaves: Iterator[Any]) -> Any:
    """The sample `template` builds from `leaves` (dicts, and tuples as lists)."""
    if template is None:
        return next(leaves)
    if isinstance(template, tuple):
        keys, children = template
        return {key: _rebuilt(child, leaves) for key, child in zip(keys, children)}
    return [_rebuilt(child, leaves) for child in template]


class LitdataSource(Source):
    """A litdata folder: its chunks in index.json's order, each item a msgpack record of its sample."""

    codec = "msgpack"
    unit = "item"

    def __init__(self, path: str, *, allow_pickle: bool) -> None:
        self.path = path
        index_path = os.path.join(path, "index.json")
        index = read_index_json(path, "a litdata")
        if not isinstance(index, dict) or not isinstance(index.get("config"), dict) or not isinstance(index.get("chunks"), list):
            raise CommandError(f"{index_path}: not a litdata index (a map with its config and its list of chunks)")
        config = index["config"]
        if config.get("item_loader", "PyTreeLoader") != "PyTreeLoader":
            raise CommandError(f"{index_path}: item_loader {config.get('item_loader')!r}; convert reads PyTreeLoader "
                               "chunks (litdata's default)")
        if config.get("encryption"):
            raise CommandError(f"{index_path}: encrypted chunks; decrypt them with litdata first")
        self.compression = self._compression(config, index_path)
        formats = config.get("data_format")
        if not isinstance(formats, list):
            raise CommandError(f"{index_path}: config.data_format is {formats!r}, not the list litdata writes")
        # A serializer not converted is refused when a leaf needs it: chunks of Arrow rows need none.
        decoders = [_leaf_decoder_or_refusal(name, f"{index_path}, data_format", allow_pickle) for name in formats]
        self.decoders = [decoder for decoder, _ in decoders]
        self.fixed = [fixed for _, fixed in decoders]
        self.sizes = struct.Struct(f"<{len(decoders)}I")  # an item's header: the size of each leaf
        try:
            spec = json.loads(config["data_spec"])[1]
        except (KeyError, TypeError, ValueError, IndexError) as error:
            raise CommandError(f"{index_path}: config.data_spec is not torch's pytree JSON: {error!r}") from None
        self.template = _template(spec, f"{index_path}, data_spec")
        if _leaf_count(self.template) != len(self.decoders):
            raise CommandError(f"{index_path}: data_spec has {_leaf_count(self.template)} leaves and data_format "
                               f"{len(self.decoders)} serializers")
        self.chunks = [self._chunk(entry, position, index_path) for position, entry in enumerate(index["chunks"])]
        self.total = sum(items for _, items, _ in self.chunks)

    @staticmethod
    def _compression(config: dict[str, Any], where: str) -> str | None:
        """None, or how zstd wraps the chunks: "chunk", "batch" or "sample"."""
        compression = config.get("compression")
        if compression is None:
            return None
        if not isinstance(compression, str) or compression.split(":")[0] != "zstd":
            raise CommandError(f"{where}: compression {compression!r}; convert reads uncompressed and zstd chunks")
        level = config.get("compression_level") or "chunk"  # litdata reads an absent level as whole-file
        if level not in ("chunk", "batch", "sample"):
            raise CommandError(f"{where}: compression_level {level!r} is not chunk, batch or sample")
        return level

    def _chunk(self, entry: Any, position: int, where: str) -> tuple[str, int, int]:
        """(path, items, bytes) of chunk `position`, its file checked to be inside the folder and of its size."""
        where = f"{where}, chunk {position}"
        if not isinstance(entry, dict):
            raise CommandError(f"{where}: not a map")
        name, items, size = entry.get("filename"), entry.get("chunk_size"), entry.get("chunk_bytes")
        if not isinstance(name, str) or os.path.basename(name) != name or name in ("", ".", ".."):
            raise CommandError(f"{where}: the chunk file {name!r} is not a file name in the folder")
        if not all(isinstance(value, int) and not isinstance(value, bool) and value >= 0 for value in (items, size)):
            raise CommandError(f"{where}: chunk_size {items!r} and chunk_bytes {size!r} are not counts")
        path = os.path.join(self.path, name)
        if not os.path.isfile(path):
            raise CommandError(f"{where}: its chunk file {path} is missing")
        # chunk_bytes is the file's size, or for whole-file compression the size it decompresses to.
        if self.compression != "chunk" and os.path.getsize(path) != size:
            raise CommandError(f"{path}: {os.path.getsize(path):,} bytes, and index.json says {size:,}")
        if 4 * (items + 2) > size:
            raise CommandError(f"{path}: index.json says {items:,} items in {size:,} bytes, fewer than their offsets take")
        return path, items, size

    def whole(self) -> dict[str, Any]:
        return {"first": 0, "stop": len(self.chunks)}

    def split(self, count: int) -> list[dict[str, Any]]:
        """Parts of consecutive chunks."""
        return even_parts(count, len(self.chunks))

    def write_part(self, writer: ShardedWriter, progress: Counter, part: dict[str, Any]) -> None:
        for path, items, size in self.chunks[part["first"] : part["stop"]]:
            for position, payload in enumerate(_item_payloads(path, items, size, self.compression)):
                where = f"{path}, item {position}"
                try:
                    sample = payload if isinstance(payload, dict) else self._sample(payload)
                except (_ItemError, RawImageError) as error:
                    raise CommandError(f"{where}: {error}") from None
                append_record(writer, sample, where)
            progress(items)

    def _sample(self, data: bytes) -> Any:
        header = self.sizes.size
        if len(data) < header:
            raise _ItemError(f"{len(data)} bytes, fewer than the sizes of its {len(self.decoders)} leaves")
        sizes = self.sizes.unpack_from(data)
        if header + sum(sizes) != len(data):
            raise _ItemError(f"its leaves' sizes {list(sizes)} and their header add up to "
                             f"{header + sum(sizes):,} bytes, not its {len(data):,}")
        leaves, at = [], header
        for position, (decoder, fixed, size) in enumerate(zip(self.decoders, self.fixed, sizes)):
            if fixed is not None and size != fixed:
                raise _ItemError(f"leaf {position} is {size} bytes, and its serializer writes {fixed}")
            try:
                leaves.append(decoder(data[at : at + size]))
            except (pickle.UnpicklingError, EOFError, AttributeError, ImportError) as error:
                raise _ItemError(f"leaf {position} does not unpickle: {error!r}") from None
            at += size
        return _rebuilt(self.template, iter(leaves))


def _item_payloads(path: str, items: int, size: int, compression: str | None) -> Iterator[bytes | dict[str, Any]]:
    """The bytes of each item of the chunk at `path`, which index.json says holds `items` in `size` bytes (once
    decompressed), checked against the file; or, for a chunk whose samples litdata keeps only as Arrow rows in
    its footer, each row."""
    if compression == "batch":
        yield from _framed_items(path, items)
        return
    with (_opened_chunk(path, size if compression == "chunk" else None) as file,
          mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as mapped):
        footer = _arrow_footer(mapped, path)
        offsets = _offsets(mapped, path, items, len(mapped) if footer is None else footer[0])
        if footer is not None and items and offsets[-1] == offsets[0]:
            yield from _arrow_rows(mapped[footer[0] : footer[1]], path, items)
            return
        for position in range(items):
            payload = mapped[offsets[position] : offsets[position + 1]]
            yield _inflated(payload, path, position) if compression == "sample" else payload


def _offsets(data: Any, path: str, items: int, end: int) -> list[int]:
    """The item offsets after a chunk's item count: `items` + 1 of them, increasing from the end of their table
    to `end` (the chunk's end, or its Arrow footer's start)."""
    (count,) = struct.unpack_from("<I", data, 0)
    if count != items:
        raise CommandError(f"{path}: holds {count:,} items, and index.json says {items:,}")
    table_end = 4 + 4 * (items + 1)
    if table_end > len(data):
        raise CommandError(f"{path}: its {items:,} item offsets run past its end")
    offsets = np.frombuffer(data[4:table_end], "<u4").astype(np.int64)
    if offsets[0] != table_end or offsets[-1] != end or (np.diff(offsets) < 0).any():
        raise CommandError(f"{path}: its item offsets ({offsets[0]} to {offsets[-1]}) are not increasing from "
                           f"{table_end} to the end of its items ({end:,})")
    return offsets.tolist()


def _arrow_footer(data: Any, path: str) -> tuple[int, int] | None:
    """(start, end) of the Arrow IPC file litdata appends to a chunk of dict samples (its length as uint32, then
    the magic ``LDARW01``), or None if the chunk has none."""
    if len(data) < 12 or data[-8:] != _ARROW_FOOTER_MAGIC:
        return None
    (length,) = struct.unpack_from("<I", data, len(data) - 12)
    start = len(data) - 12 - length
    if start < 8:
        raise CommandError(f"{path}: its Arrow footer claims {length:,} bytes, more than the chunk holds")
    return start, start + length


def _arrow_rows(ipc: bytes, path: str, items: int) -> Iterator[dict[str, Any]]:
    """The rows of a chunk's Arrow footer, as the Hugging Face converter turns Arrow rows into records."""
    pa = require_extra("pyarrow", "litdata", "converting litdata chunks of Arrow rows")
    try:
        reader = pa.ipc.open_file(pa.py_buffer(ipc))
        batches = [reader.get_batch(i) for i in range(reader.num_record_batches)]
    except (pa.ArrowException, OSError) as error:
        raise CommandError(f"{path}: its Arrow footer is not an Arrow file pyarrow can read: {error}") from None
    if sum(batch.num_rows for batch in batches) != items:
        raise CommandError(f"{path}: its Arrow footer holds {sum(batch.num_rows for batch in batches):,} rows, and "
                           f"index.json says {items:,} items")
    row = 0
    for batch in batches:
        names = batch.schema.names
        columns = [column_values(batch.column(i), None, f"{path}, item", row) for i in range(len(names))]
        for values in zip(*columns):
            yield dict(zip(names, values))
        row += batch.num_rows


def _opened_chunk(path: str, expected: int | None) -> Any:
    """The chunk file or, given the `expected` size it decompresses to, a temporary file of it decompressed from
    whole-file zstd, read in pieces (memory stays constant; one that inflates past `expected` is refused)."""
    if expected is None:
        return open(path, "rb")
    zstandard = require_extra("zstandard", "litdata", "converting zstd-compressed litdata chunks")
    output = tempfile.TemporaryFile()  # noqa: SIM115 (returned open, for the caller to close)
    try:
        with open(path, "rb") as compressed_file:
            reader = zstandard.ZstdDecompressor().stream_reader(compressed_file, read_across_frames=True)
            written = 0
            try:
                while chunk := reader.read(_READ_BYTES):
                    written += len(chunk)
                    if written > expected:
                        raise CommandError(f"{path}: decompresses to more than the {expected:,} bytes index.json says")
                    output.write(chunk)
            except zstandard.ZstdError as error:
                raise CommandError(f"{path}: not a whole zstd stream: {error}") from None
        if written != expected:
            raise CommandError(f"{path}: decompresses to {written:,} bytes, and index.json says {expected:,}")
        output.flush()
        output.seek(0)
        return output
    except BaseException:
        output.close()
        raise


def _inflated(payload: bytes, path: str, position: int) -> bytes:
    zstandard = require_extra("zstandard", "litdata", "converting zstd-compressed litdata chunks")
    try:
        return zstandard.ZstdDecompressor().decompressobj().decompress(payload)
    except zstandard.ZstdError as error:
        raise CommandError(f"{path}, item {position}: not a zstd frame: {error}") from None


def _framed_items(path: str, items: int) -> Iterator[bytes]:
    """The items of a framed-zstd chunk (litdata's ``LDFZ01`` layout), one frame decompressed at a time."""
    zstandard = require_extra("zstandard", "litdata", "converting zstd-compressed litdata chunks")
    with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        size = len(mapped)
        if size < _FRAMED_PREFIX.size:
            raise CommandError(f"{path}: {size} bytes, shorter than a framed-zstd chunk's header")
        magic, version, _, count, _, frames = _FRAMED_PREFIX.unpack_from(mapped, 0)
        if magic != _FRAMED_MAGIC or version != 1:
            raise CommandError(f"{path}: not a framed-zstd chunk of version 1 (magic {magic!r}, version {version})")
        if count != items:
            raise CommandError(f"{path}: holds {count:,} items, and index.json says {items:,}")
        table = _FRAMED_PREFIX.size + 4 * (items + 1)
        if table + _FRAME.size * frames > size:
            raise CommandError(f"{path}: its {items:,} offsets and {frames:,} frames run past its end")
        offsets = np.frombuffer(mapped[_FRAMED_PREFIX.size : table], "<u4").astype(np.int64)
        if offsets[0] != 0 or (np.diff(offsets) < 0).any():
            raise CommandError(f"{path}: its item offsets do not increase from 0")
        next_item = 0
        for frame in range(frames):
            first, count, start, length, raw_length = _FRAME.unpack_from(mapped, table + _FRAME.size * frame)
            if first != next_item or first + count > items or start + length > size:
                raise CommandError(f"{path}, frame {frame}: items {first} to {first + count} at bytes {start} to "
                                   f"{start + length} do not follow the frame before it inside the file")
            if offsets[first + count] - offsets[first] != raw_length:
                raise CommandError(f"{path}, frame {frame}: {raw_length:,} bytes, and its items' offsets span "
                                   f"{offsets[first + count] - offsets[first]:,}")
            try:
                raw = zstandard.ZstdDecompressor().decompress(mapped[start : start + length], max_output_size=raw_length)
            except zstandard.ZstdError as error:
                raise CommandError(f"{path}, frame {frame}: not a zstd frame of {raw_length:,} bytes: {error}") from None
            if len(raw) != raw_length:
                raise CommandError(f"{path}, frame {frame}: decompresses to {len(raw):,} bytes, not {raw_length:,}")
            base = offsets[first]
            for item in range(first, first + count):
                yield raw[offsets[item] - base : offsets[item + 1] - base]
            next_item = first + count
        if next_item != items:
            raise CommandError(f"{path}: its frames hold {next_item:,} of its {items:,} items")

"""What ``varstore convert`` reads: one class per source format, each streaming its records into a writer.

Every source reads in bounded pieces (memory maps for arrays and token files,
line by line for text, batches for Parquet, one file at a time for folders), so
memory stays constant whatever the input's size. A record must be whole in memory
to be written, so a line or a folder's file longer than `max_record_bytes` is
refused. A source whose header claims more records than it has bytes (an .npy
of shape (2**40, 0), a Parquet file of 2**40 null rows) is refused before
anything is written; every other source yields at most one record per byte (or,
for folders, per file) it reads, so no input can make convert write an index
out of proportion to itself. Errors name the file and the line, row or record
concerned.
"""

from __future__ import annotations

import itertools
import json
import os
from typing import Any, Iterator

import msgpack
import numpy as np

from ..dataset.writer import ShardedWriter
from ..errors import CommandError, RecordTypeError, UsageError, require_extra
from ..format.codecs import canonical_dtype
from ..progress import Counter
from .fields import field_value, matching_key
from .huggingface import HuggingFaceSource
from .litdata import LitdataSource
from .mds import MdsSource
from .source_base import Source, append_record, check_claimed_count, even_parts, field_record
from .tfrecord import TFRecordSource
from .webdataset import WebDatasetSource

_CHUNK_BYTES = 16 << 20
_PROGRESS_STEP_BYTES = 1 << 20
_PARQUET_BATCH_ROWS = 4096
DEFAULT_MAX_RECORD_BYTES = 64 << 20
_TOKEN_DTYPES = "int8, int16, int32, int64, uint8, uint16, uint32, uint64"


FORMAT_BY_SUFFIX = {".npy": "npy", ".bin": "tokens", ".jsonl": "jsonl", ".ndjson": "jsonl", ".txt": "text", ".parquet": "parquet",
                    ".arrow": "huggingface", ".tar": "webdataset", ".tgz": "webdataset", ".tfrecord": "tfrecord",
                    ".tfrecords": "tfrecord", ".tfrec": "tfrecord"}
# The options each source format reads; any other source option given is a usage error, never silently ignored.
FORMAT_OPTIONS = {
    "npy": {"offsets"},
    "tokens": {"dtype", "separator", "drop_separator"},
    "jsonl": {"field", "skip_null", "codec", "max_record_bytes"},
    "text": {"codec", "max_record_bytes"},
    "folder": {"labels", "max_record_bytes"},
    "parquet": {"field", "skip_null", "codec"},
    "huggingface": {"field", "skip_null", "codec"},
    "mds": {"allow_pickle"},
    "litdata": {"allow_pickle"},
    "webdataset": {"decode", "max_record_bytes", "source_storage_options"},
    "tfrecord": {"codec", "compression_type", "max_record_bytes", "source_storage_options"},
}
FOLDER_FORMATS = {"folder", "mds", "litdata"}  # the formats read from a folder; the others from a file, except these:
FOLDER_OR_FILE_FORMATS = {"huggingface"}  # a save_to_disk folder or one of its files
# The formats whose SRC names many files (a brace pattern, glob or URL: `input_files`), which their sources find.
MANY_FILE_FORMATS = {"webdataset", "tfrecord"}
SOURCE_OPTIONS = ("offsets", "dtype", "separator", "drop_separator", "field", "skip_null", "codec", "labels", "max_record_bytes",
                  "decode", "compression_type", "source_storage_options",
                  "allow_pickle")


def source_format(path: str, format: str | None) -> str:
    """The format of the source at `path`: `format` if given, else told by its name (a folder is "folder")."""
    if format is not None:
        if format not in FORMAT_OPTIONS:
            raise UsageError(f"unknown source format {format!r}; the formats are {', '.join(sorted(FORMAT_OPTIONS))}")
        return format
    if os.path.isdir(path):
        return "folder"
    stem, suffix = os.path.splitext(path)
    if suffix.lower() == ".gz" and os.path.splitext(stem)[1].lower() in (".tar", ".tfrecord", ".tfrecords", ".tfrec"):
        suffix = os.path.splitext(stem)[1]  # FILE.tar.gz, FILE.tfrecord.gz
    suffix = suffix.lower()
    if suffix not in FORMAT_BY_SUFFIX:
        raise UsageError(f"cannot tell the format of {path} from its name; pass --format ({', '.join(sorted(FORMAT_OPTIONS))})")
    return FORMAT_BY_SUFFIX[suffix]


def open_source(path: str, kind: str, options: dict[str, Any]) -> Source:
    """The source of format `kind` at `path`, with `options` (names of `SOURCE_OPTIONS`, None for unset) checked
    against its format: plain values, so another process opens the same source from them."""
    if kind not in MANY_FILE_FORMATS and not os.path.exists(path):
        raise CommandError(f"{path}: no such file or folder")
    for option in SOURCE_OPTIONS:
        if options.get(option) is not None and option not in FORMAT_OPTIONS[kind]:
            raise UsageError(f"--{option.replace('_', '-')} does not apply to {kind} sources")
    unknown = sorted(set(options) - set(SOURCE_OPTIONS))
    if unknown:
        raise UsageError(f"unknown source option {unknown[0]!r}; the options are {', '.join(SOURCE_OPTIONS)}")
    if kind not in FOLDER_OR_FILE_FORMATS | MANY_FILE_FORMATS and (kind in FOLDER_FORMATS) != os.path.isdir(path):
        raise UsageError(f"{path}: the {kind} format needs {'a folder' if kind in FOLDER_FORMATS else 'a file'}")
    if kind == "npy":
        return NpySource(path, options.get("offsets"))
    if kind == "tokens":
        if options.get("dtype") is not None:
            token_dtype(options["dtype"])  # a dtype given is judged before the options missing
        missing = [f"--{name}" for name in ("dtype", "separator") if options.get(name) is None]
        if missing:
            needs = {"--dtype": "--dtype (e.g. uint16)", "--separator": "--separator (the end-of-document token id)"}
            raise UsageError(f"a token file needs {' and '.join(needs[name] for name in missing)}")
        return TokenSource(path, options["dtype"], options["separator"], drop_separator=bool(options.get("drop_separator")))
    max_record_bytes = options.get("max_record_bytes") or DEFAULT_MAX_RECORD_BYTES
    if kind == "webdataset":
        return WebDatasetSource(path, decode=bool(options.get("decode")), max_record_bytes=max_record_bytes,
                                storage_options=options.get("source_storage_options"))
    if kind == "tfrecord":
        return TFRecordSource(path, codec=options.get("codec"), compression_type=options.get("compression_type"),
                              max_record_bytes=max_record_bytes, storage_options=options.get("source_storage_options"))
    skip_null = bool(options.get("skip_null"))
    if kind == "jsonl":
        return JsonLinesSource(path, options.get("field"), options.get("codec"), max_record_bytes, skip_null=skip_null)
    if kind == "text":
        return TextSource(path, options.get("codec"), max_record_bytes)
    if kind == "huggingface":
        return HuggingFaceSource(path, options.get("field"), options.get("codec"), skip_null=skip_null)
    if kind == "litdata":
        return LitdataSource(path, allow_pickle=bool(options.get("allow_pickle")))
    if kind == "mds":
        return MdsSource(path, allow_pickle=bool(options.get("allow_pickle")))
    if kind == "parquet":
        return ParquetSource(path, options.get("field"), options.get("codec"), skip_null=skip_null)
    return FolderSource(path, max_record_bytes, labels=bool(options.get("labels")))


class NpySource(Source):
    """A ``.npy`` array, one record per row, or split along its first axis by an offsets ``.npy`` file."""

    codec = "ndarray"

    def __init__(self, path: str, offsets_path: str | None) -> None:
        self.path = path
        self.array = _map_npy(path)
        if self.array.ndim == 0:
            raise CommandError(f"{path}: holds a single value, not rows of records")
        # A dimension can exceed the file's bytes only beside a zero one (rows of no bytes): an absurd shape.
        check_claimed_count(path, max(self.array.shape), f"its shape {self.array.shape} has a dimension of {max(self.array.shape):,}")
        try:
            self.dtype = canonical_dtype(self.array.dtype)
        except RecordTypeError as error:
            raise CommandError(f"{path}: {error}") from None
        self.total = self.array.nbytes
        if offsets_path is None:
            self.offsets = None
            self.shape = self.array.shape[2:]
        else:
            self.offsets = _checked_offsets(offsets_path, len(self.array))
            self.shape = self.array.shape[1:]

    def split(self, count: int) -> list[dict[str, Any]]:
        """Parts of consecutive records (rows, or splits of rows by the offsets)."""
        return even_parts(count, len(self.array) if self.offsets is None else len(self.offsets) - 1)

    def write_part(self, writer: ShardedWriter, progress: Counter, part: dict[str, Any]) -> None:
        if self.offsets is None:
            self._write_rows(writer, progress, part["first"], part["stop"])
        else:
            self._write_splits(writer, progress, part["first"], part["stop"])

    def _write_rows(self, writer: ShardedWriter, progress: Counter, first: int, stop: int | None) -> None:
        array = self.array
        rows_per_chunk = max(1, _CHUNK_BYTES // max(1, array[:1].nbytes))
        length = array.shape[1] if array.ndim > 1 else 1
        stop = len(array) if stop is None else stop
        for start in range(first, stop, rows_per_chunk):
            chunk = array[start : min(stop, start + rows_per_chunk)]
            writer.extend_flat(chunk.reshape((-1, *self.shape)), np.full(len(chunk), length, np.int64))
            progress(chunk.nbytes)

    def _write_splits(self, writer: ShardedWriter, progress: Counter, first: int, stop: int | None) -> None:
        array, offsets = self.array, self.offsets
        assert offsets is not None
        rows_per_chunk = max(1, _CHUNK_BYTES // max(1, array[:1].nbytes))
        count = len(offsets) - 1 if stop is None else stop
        while first < count:
            last = int(np.searchsorted(offsets, offsets[first] + rows_per_chunk, side="right")) - 1
            last = min(count, max(first + 1, last))
            values = array[int(offsets[first]) : int(offsets[last])]
            writer.extend_flat(values, np.diff(offsets[first : last + 1]).astype(np.int64))
            progress(values.nbytes)
            first = last


def _map_npy(path: str) -> np.ndarray:
    try:
        array = np.load(path, mmap_mode="r", allow_pickle=False)
    except EOFError:
        raise CommandError(f"{path}: empty file, not an .npy array") from None
    except (ValueError, OverflowError) as error:
        raise CommandError(f"{path}: not an .npy array that can be memory-mapped: {error}") from None
    if not isinstance(array, np.ndarray):
        array.close()  # np.load opened an .npz archive: several arrays, not one
        raise CommandError(f"{path}: an .npz archive of several arrays, not an .npy array; save the array with numpy.save")
    return array


def _checked_offsets(path: str, rows: int) -> np.ndarray:
    """Record boundaries from an .npy file: N + 1 non-decreasing integers from 0 to `rows`."""
    offsets = _map_npy(path)
    if offsets.ndim != 1 or offsets.dtype.kind not in "iu" or len(offsets) == 0:
        raise CommandError(f"{path}: offsets must be a 1-D integer array of N + 1 boundaries, found {offsets.dtype} {offsets.shape}")
    if offsets[0] != 0 or offsets[-1] != rows:
        raise CommandError(f"{path}: offsets must run from 0 to the array's {rows} rows, found {offsets[0]} to {offsets[-1]}")
    step = _CHUNK_BYTES // offsets.itemsize
    for start in range(0, len(offsets) - 1, step):
        drops = np.flatnonzero(np.diff(offsets[start : start + step + 1]) < 0)
        if drops.size:
            raise CommandError(f"{path}: offsets decrease after position {start + int(drops[0])}")
    return offsets


def token_dtype(dtype: Any) -> np.dtype:
    """`dtype` as the integer dtype of token ids, or a `UsageError` that lists the ones a token file may have."""
    try:
        found = canonical_dtype(dtype)
    except RecordTypeError:
        raise UsageError(f"--dtype {dtype} is not a dtype token ids can have; the token dtypes are {_TOKEN_DTYPES}") from None
    if found.kind not in "iu":
        raise UsageError(f"--dtype must be an integer type for token ids ({_TOKEN_DTYPES}), not {found.name}")
    return found


class TokenSource(Source):
    """A raw token file (nanoGPT's ``.bin``): one integer dtype, documents split at a separator token.

    Each separator ends its document and, unless `drop_separator`, stays its last
    token, so an end-of-text token reaches training as it would from the raw
    file: ``[1, 2, 9, 3, 9, 4]`` with separator 9 gives ``[1, 2, 9] [3, 9] [4]``
    (``[1, 2] [3] [4]`` when dropped). The tokens after the last separator, if
    any, form the last record; adjacent separators make a record of the
    separator alone (an empty one when dropped).
    """

    codec = "ndarray"

    def __init__(self, path: str, dtype: str, separator: int, *, drop_separator: bool) -> None:
        self.path = path
        self.dtype = token_dtype(dtype)
        limits = np.iinfo(self.dtype)
        if not limits.min <= separator <= limits.max:
            raise UsageError(f"--separator {separator} does not fit {self.dtype.name} [{limits.min}, {limits.max}]")
        self.separator, self.drop_separator = separator, drop_separator
        size = os.path.getsize(path)
        if size % self.dtype.itemsize:
            raise CommandError(f"{path}: {size} bytes is not a whole number of {self.dtype.itemsize}-byte {self.dtype.name} tokens")
        self.total = size

    def split(self, count: int) -> list[dict[str, Any]]:
        """Parts of whole documents: each cut moved forward to just after the next separator."""
        tokens = self.total // self.dtype.itemsize
        if not tokens:
            return [{"first": 0, "stop": 0}]
        ids = np.memmap(self.path, self.dtype, mode="r")
        bounds = [0]
        for position in range(1, count):
            cut = max(bounds[-1], tokens * position // count)
            bounds.append(self._after_separator(ids, cut))
        bounds.append(tokens)
        return [{"first": first, "stop": stop} for first, stop in zip(bounds, bounds[1:]) if stop > first]

    def _after_separator(self, ids: np.ndarray, position: int) -> int:
        """The first document start at or after token `position` (just after a separator), or the end."""
        if position == 0:
            return 0
        chunk_tokens = _CHUNK_BYTES // self.dtype.itemsize
        for start in range(position - 1, len(ids), chunk_tokens):
            found = np.flatnonzero(ids[start : start + chunk_tokens] == self.separator)
            if found.size:
                return start + int(found[0]) + 1
        return len(ids)

    def write_part(self, writer: ShardedWriter, progress: Counter, part: dict[str, Any]) -> None:
        if not self.total:
            return
        tokens = np.memmap(self.path, self.dtype, mode="r")[part["first"] : part["stop"]]
        chunk_tokens = _CHUNK_BYTES // self.dtype.itemsize
        kept = 0 if self.drop_separator else 1  # how many tokens of its separator a document keeps
        start = 0  # where the current record began
        for chunk_start in range(0, len(tokens), chunk_tokens):
            chunk = tokens[chunk_start : chunk_start + chunk_tokens]
            separators = np.flatnonzero(chunk == self.separator) + chunk_start
            if separators.size:
                # The first record may have begun in an earlier chunk: append it as a view of the map.
                writer.append(tokens[start : separators[0] + kept])
                between = tokens[separators[0] + 1 : separators[-1] + kept]
                if self.drop_separator:
                    between = between[between != self.separator]
                writer.extend_flat(between, np.diff(separators) - 1 + kept)
                start = int(separators[-1]) + 1
            progress(chunk.nbytes)
        if start < len(tokens):
            writer.append(tokens[start:])


def _line_parts(path: str, count: int) -> list[dict[str, Any]]:
    """At most `count` parts of whole lines of the file at `path`: {"first": byte, "stop": byte, "line": the
    number of its first line}. Each even cut moves forward to just after the next newline; the line numbers
    come from counting newlines up to the last cut (one read of the file, at memory speed)."""
    size = os.path.getsize(path)
    starts = [0]
    with open(path, "rb") as file:
        for position in range(1, count):
            starts.append(_after_newline(file, max(starts[-1], size * position // count), size))
        lines, counted, newlines = [1], 0, 0
        file.seek(0)
        for start in starts[1:]:
            while counted < start:
                chunk = file.read(min(_CHUNK_BYTES, start - counted))
                newlines += chunk.count(b"\n")
                counted += len(chunk)
            lines.append(newlines + 1)
    parts = [{"first": first, "stop": stop, "line": line} for first, stop, line in zip(starts, starts[1:] + [size], lines)]
    return [part for part in parts if part["stop"] > part["first"]] or [{"first": 0, "stop": 0, "line": 1}]


def _after_newline(file: Any, position: int, size: int) -> int:
    """The first line start at or after byte `position` of `file` (just after a newline), or `size`."""
    if position == 0:
        return 0
    file.seek(position - 1)
    while chunk := file.read(_CHUNK_BYTES):
        found = chunk.find(b"\n")
        if found >= 0:
            return file.tell() - len(chunk) + found + 1
    return size


def _lines(path: str, progress: Counter, max_bytes: int, part: dict[str, Any]) -> Iterator[tuple[int, bytes]]:
    """(line number, line without its line ending) of the lines of `part` ({"first": byte, "stop": byte or None,
    "line": number of the first}), reporting bytes read; a line over `max_bytes` is refused."""
    pending, number = 0, part.get("line", 1) - 1
    left = None if part["stop"] is None else part["stop"] - part["first"]
    with open(path, "rb") as file:
        if part["first"]:
            file.seek(part["first"])
        # Reading at most max_bytes + 2 (the longest ending, \r\n) bounds memory whatever the file holds.
        while (left is None or left > 0) and (line := file.readline(max_bytes + 2)):
            if left is not None:
                left -= len(line)
            number += 1
            pending += len(line)
            if pending >= _PROGRESS_STEP_BYTES:
                progress(pending)
                pending = 0
            text = line.removesuffix(b"\n").removesuffix(b"\r")
            if len(text) > max_bytes:
                raise CommandError(f"{path}, line {number}: longer than --max-record-bytes ({max_bytes:,} bytes)")
            yield number, text
    progress(pending)


class _SampleSource(Source):
    """A source of structured samples, each stored whole (msgpack) or, with `field`, as that field's text or bytes;
    with `skip_null`, a sample whose field is null is left out (and counted in `skipped`) instead of refused."""

    field: str | None = None
    skip_null = False

    def _append_sample(self, writer: ShardedWriter, sample: Any, where: str, part: str) -> None:
        """Append `sample` (or its field, which error messages call its `part`: field, column) read at `where`."""
        if self.field is not None:
            value = field_value(sample, self.field, where)
            if value is None and self.skip_null:
                self.skipped += 1
                return
            sample = field_record(value, self.codec, f"{where}, {part} {self.field!r}")
        append_record(writer, sample, where)


class JsonLinesSource(_SampleSource):
    """JSON Lines: each line a structured sample (msgpack), or one text field of it (str or bytes).

    With `skip_null`, a line whose field is null is left out (and counted in `skipped`) instead of refused.
    """

    def __init__(self, path: str, field: str | None, codec: str | None, max_record_bytes: int, *, skip_null: bool) -> None:
        if codec is not None and field is None:
            raise UsageError("--codec applies to JSON Lines only with --field; whole samples are stored as msgpack")
        if skip_null and field is None:
            raise UsageError("--skip-null applies to JSON Lines only with --field; whole samples may hold nulls")
        self.path, self.field, self.max_record_bytes, self.skip_null = path, field, max_record_bytes, skip_null
        self.codec = "msgpack" if field is None else codec or "str"
        self.total = os.path.getsize(path)

    def split(self, count: int) -> list[dict[str, Any]]:
        return _line_parts(self.path, count)

    def write_part(self, writer: ShardedWriter, progress: Counter, part: dict[str, Any]) -> None:
        for number, line in _lines(self.path, progress, self.max_record_bytes, part):
            if not line.strip():
                continue
            where = f"{self.path}, line {number}"
            self._append_sample(writer, _parse_json_line(line, where), where, "field")


def _parse_json_line(line: bytes, where: str) -> Any:
    try:
        return json.loads(line.decode("utf-8"))
    except ValueError as error:  # UnicodeDecodeError included
        raise CommandError(f"{where}: not valid JSON: {error}") from None
    except RecursionError:
        raise CommandError(f"{where}: JSON nested too deeply to read") from None
    except MemoryError:
        raise CommandError(f"{where}: not enough memory to parse this line") from None


class TextSource(Source):
    """A text file, one record per line (line endings removed); str records, or bytes with no decoding."""

    def __init__(self, path: str, codec: str | None, max_record_bytes: int) -> None:
        self.path, self.max_record_bytes = path, max_record_bytes
        self.codec = codec or "str"
        self.total = os.path.getsize(path)

    def split(self, count: int) -> list[dict[str, Any]]:
        return _line_parts(self.path, count)

    def write_part(self, writer: ShardedWriter, progress: Counter, part: dict[str, Any]) -> None:
        for number, line in _lines(self.path, progress, self.max_record_bytes, part):
            where = f"{self.path}, line {number}"
            if self.codec == "bytes":
                append_record(writer, line, where)
                continue
            try:
                text = line.decode("utf-8")
            except UnicodeDecodeError as error:
                raise CommandError(f"{where}: not valid UTF-8 ({error}); --codec bytes keeps raw bytes") from None
            append_record(writer, text, where)


class FolderSource(Source):
    """A folder of files, one msgpack record per file, sorted by path: ``{"name": relative path, "data": bytes}``.

    With `labels`, torchvision's ImageFolder convention: each file lies below a
    class sub-folder, its record is ``{"image": bytes, "label": int, "path":
    relative path}``, and the label is the position of its class among the
    sorted sub-folder names, which the metadata lists as ``labels`` (so the
    labels are those ImageFolder would give). Hidden entries (names starting
    with ``.``: ``.DS_Store``, ``.ipynb_checkpoints/``) are left out at every
    level, with or without labels; ImageFolder would make ``.ipynb_checkpoints``
    a class. A class folder with no file is refused, as ImageFolder refuses it.
    Links to files are read; a link to a class folder is followed, as
    ImageFolder does; other links to folders are refused rather than followed
    (they may loop). A record is written whole, so a file over
    `max_record_bytes` is refused before it is read.
    """

    codec = "msgpack"
    unit = "file"

    def __init__(self, path: str, max_record_bytes: int, *, labels: bool) -> None:
        self.path, self.max_record_bytes = path, max_record_bytes
        self.labels = _class_names(path) if labels else None
        if self.labels is not None:
            self.metadata = {"labels": self.labels}

    @property
    def class_folders(self) -> list[str]:
        """The class folders read with labels (a link among them is followed), in label order; none without."""
        return [os.path.join(self.path, name) for name in self.labels or []]

    def split(self, count: int) -> list[dict[str, Any]]:
        """Parts of consecutive files, in the records' order."""
        return even_parts(count, sum(1 for _ in self._files()))

    def write_part(self, writer: ShardedWriter, progress: Counter, part: dict[str, Any]) -> None:
        for label, path, name in itertools.islice(self._files(), part["first"], part["stop"]):
            if label is None:
                writer._append_payload(self._record(path, {"name": name}, "data", {}))
            else:
                writer._append_payload(self._record(path, {}, "image", {"label": label, "path": name}))
            progress(1)

    def _files(self) -> Iterator[tuple[int | None, str, str]]:
        """(label or None, path, relative name) of every file, in record order."""
        if self.labels is None:
            for path, name in _files_in(self.path, ""):
                yield None, path, name
            return
        for label, class_name in enumerate(self.labels):
            for path, name in _files_in(os.path.join(self.path, class_name), class_name + "/"):
                yield label, path, name

    def _record(self, path: str, before: dict[str, Any], key: str, after: dict[str, Any]) -> bytearray:
        """The record of the file at `path` as the msgpack codec encodes ``{**before, key: its bytes, **after}``,
        with the bytes read straight into it: held once, not read and then copied into the encoding twice. A file
        over the limit is refused before it is read, one that grows past it while read (at most the limit and one
        byte are read), and one that does not fit in memory with a one-line error."""
        if os.path.isdir(path):
            raise CommandError(f"{path}: a link to a folder; convert follows such links only as --labels class folders "
                               "(others may loop)")
        if not os.path.isfile(path):
            raise CommandError(f"{path}: not a regular file; convert reads regular files and links to them")
        with open(path, "rb") as file:
            size = os.fstat(file.fileno()).st_size
            self._check_size(path, size)
            head, tail = _msgpack_map_around(path, before, key, size, after)
            try:
                record = bytearray(len(head) + size + len(tail))
                record[: len(head)] = head
                got = file.readinto(memoryview(record)[len(head) : len(head) + size])
                more = file.read(1)  # it grew since fstat: read on to the limit and one byte, no further
                more += file.read(self.max_record_bytes - size) if more else b""
            except MemoryError:
                raise CommandError(f"{path}: not enough memory to read its {size:,} bytes") from None
        if got < size or more:  # it changed while read: frame what was read (rare, so copied)
            data = bytes(memoryview(record)[len(head) : len(head) + got]) + more
            self._check_size(path, len(data))
            head, tail = _msgpack_map_around(path, before, key, len(data), after)
            return bytearray(head + data + tail)
        record[len(head) + size :] = tail
        return record

    def _check_size(self, path: str, size: int) -> None:
        """Refuse the file at `path`, of `size` bytes, if it is over the limit."""
        if size > self.max_record_bytes:
            raise CommandError(
                f"{path}: {size:,} bytes is over --max-record-bytes ({self.max_record_bytes:,}); "
                "each file becomes one record, held whole in memory while it is written"
            )


def _msgpack_map_around(path: str, before: dict[str, Any], key: str, size: int,
                        after: dict[str, Any]) -> tuple[bytes, bytes]:
    """The msgpack encoding of the map ``{**before, key: <size bytes>, **after}`` (str keys, str and int values) on
    either side of the bytes, as the msgpack codec writes it: the bytes' value is a bin of the smallest width."""
    if size >= 1 << 32:
        raise CommandError(f"{path}: {size:,} bytes is more than a msgpack bin value holds (4 GiB - 1 bytes)")
    packer = msgpack.Packer(use_bin_type=True)  # autoreset: each call returns the bytes of what it packed
    width, marker = (1, 0xC4) if size < 1 << 8 else (2, 0xC5) if size < 1 << 16 else (4, 0xC6)
    head = [packer.pack_map_header(len(before) + 1 + len(after))]
    head += [packer.pack(item) for pair in before.items() for item in pair]
    head += [packer.pack(key), bytes([marker]) + size.to_bytes(width, "big")]
    return b"".join(head), b"".join(packer.pack(item) for pair in after.items() for item in pair)


def _visible_entries(directory: str) -> list[os.DirEntry[str]]:
    """The entries of `directory` sorted by name, hidden ones (names starting with ``.``) left out."""
    with os.scandir(directory) as entries:
        return sorted((entry for entry in entries if not entry.name.startswith(".")), key=lambda entry: entry.name)


def _class_names(directory: str) -> list[str]:
    """The class folders of an ImageFolder, sorted: label k is the k-th; links to folders count, as in torchvision.

    A file beside them, or a class folder holding no file, is refused.
    """
    entries = _visible_entries(directory)
    if not any(entry.is_dir() for entry in entries):
        raise CommandError(f"{directory}: --labels takes each file's label from its sub-folder, and this folder has none")
    for entry in entries:
        if not entry.is_dir():
            raise CommandError(f"{entry.path}: with --labels every file lies in a sub-folder named after its label; "
                               "this one lies in the top folder")
        if next(_files_in(entry.path, ""), None) is None:
            raise CommandError(f"{entry.path}: a class folder with no file (hidden files are left out); "
                               "--labels needs at least one file in each")
    return [entry.name for entry in entries]


def _files_in(directory: str, prefix: str) -> Iterator[tuple[str, str]]:
    """(path, name relative to the top folder with / separators) of every visible file below `directory`, sorted
    by name; links to folders are not followed (yielded, to be refused as not regular files)."""
    for entry in _visible_entries(directory):
        if entry.is_dir(follow_symlinks=False):
            yield from _files_in(entry.path, f"{prefix}{entry.name}/")
        else:
            name = prefix + entry.name
            try:
                name.encode("utf-8")
            except UnicodeEncodeError:
                raise CommandError(f"{entry.path!r}: the file name is not valid UTF-8; rename the file") from None
            yield entry.path, name


class ParquetSource(_SampleSource):
    """A Parquet file through pyarrow: each row a structured sample (msgpack), or one text or binary column.

    With `skip_null`, a row whose column value is null is left out (and counted in `skipped`) instead of refused.
    """

    unit = "row"

    def __init__(self, path: str, field: str | None, codec: str | None, *, skip_null: bool) -> None:
        parquet = require_extra("pyarrow.parquet", "parquet", "converting Parquet")
        self.path, self.field, self.skip_null = path, field, skip_null
        # Every pyarrow error derives from ArrowException (or OSError, for ArrowIOError).
        self._read_errors = (require_extra("pyarrow", "parquet", "converting Parquet").ArrowException, OSError)
        try:
            self.file = parquet.ParquetFile(path)
        except self._read_errors as error:
            raise CommandError(f"{path}: not a Parquet file pyarrow can read: {error}") from None
        schema = self.file.schema_arrow
        self.total = self.file.metadata.num_rows
        check_claimed_count(path, self.total, f"its metadata claims {self.total:,} rows")
        if field is None:
            if codec is not None or skip_null:
                option = "--codec" if codec is not None else "--skip-null"
                raise UsageError(f"{option} applies to Parquet only with --field; whole rows are stored as msgpack")
            self.codec = "msgpack"
            return
        column = matching_key(schema.names, field.split("."))
        if column is None:
            raise UsageError(f"{path} has no column {field!r}; its columns are {', '.join(schema.names)}")
        self.column = column[0]
        column_type = schema.field(self.column).type
        leaf_type = _field_type(column_type, field, column[1])
        if leaf_type is None:
            raise UsageError(f"{path} has no field {field!r}: its column {self.column!r} is {column_type}")
        self.codec = codec or ("bytes" if "binary" in str(leaf_type) else "str")

    def whole(self) -> dict[str, Any]:
        return {"first": 0, "stop": self.file.num_row_groups, "row": 0}

    def split(self, count: int) -> list[dict[str, Any]]:
        """Parts of consecutive row groups, each with the number of its first row."""
        parts = even_parts(count, self.file.num_row_groups)
        rows = [self.file.metadata.row_group(group).num_rows for group in range(self.file.num_row_groups)]
        return [{**part, "row": sum(rows[: part["first"]])} for part in parts]

    def write_part(self, writer: ShardedWriter, progress: Counter, part: dict[str, Any]) -> None:
        if part["stop"] <= part["first"]:
            return  # pyarrow reads every row group when given none
        for first_row, values in self._batches(list(range(part["first"], part["stop"])), part["row"]):
            for row, value in enumerate(values, first_row):
                self._append_sample(writer, value, f"{self.path}, row {row}", "column")
            progress(len(values))

    def _batches(self, row_groups: list[int], row: int) -> Iterator[tuple[int, list[Any]]]:
        """(first row, its batch's rows as Python dicts, of --field's column alone if given) of the row groups
        `row_groups`, whose first row is `row`; a read error names the row it reached."""
        columns = None if self.field is None else [self.column]
        batches = self.file.iter_batches(batch_size=_PARQUET_BATCH_ROWS, row_groups=row_groups, columns=columns)
        while True:
            try:
                batch = next(batches, None)
                if batch is None:
                    return
                values = batch.to_pylist()
            except self._read_errors as error:
                raise CommandError(f"{self.path}, from row {row}: pyarrow cannot read it: {error}") from None
            yield row, values
            row += len(values)


def _field_type(column_type: Any, field: str, taken: int) -> Any:
    """The pyarrow type `field` reaches inside a column of `column_type`, whose name took `taken` of its dotted
    parts, through struct fields as `field_value` finds them; None if the types do not lead there.

    Only structs are maps in a row (lists and Parquet maps become Python lists), so no other type is entered.
    """
    from pyarrow import StructType  # loaded already: only a ParquetSource calls this

    value_type, parts = column_type, field.split(".")[taken:]
    while parts:
        if not isinstance(value_type, StructType):
            return None
        names = [value_type.field(i).name for i in range(value_type.num_fields)]
        match = matching_key(names, parts)
        if match is None:
            return None
        value_type, parts = value_type.field(names.index(match[0])).type, parts[match[1]:]
    return value_type

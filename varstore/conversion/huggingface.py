"""Hugging Face `datasets` as a source: a ``save_to_disk`` folder, its Arrow files, Parquet files, or a `Dataset`.

Arrow files are memory-mapped and read one record batch at a time, Parquet files one batch of a row group at a
time, so memory stays constant. Each row becomes a msgpack record of its columns: binary values as bytes, lists
of numbers as numpy arrays of the column's dtype (lists of such lists as lists of arrays), ``Image`` and
``Audio`` features as their encoded bytes (the PNG, JPEG or WAV file `datasets` embedded), everything else as
`datasets` itself returns it (a ``ClassLabel`` as its int). With `field`, one column alone: bytes, str, or a
1-D ndarray for a list of numbers. The dataset's features (class names included) are kept in the metadata as
``huggingface_features``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import numpy as np

from ..dataset.writer import ShardedWriter
from ..errors import CommandError, UsageError, VarstoreError, require_extra
from ..format.codecs import canonical_dtype
from ..progress import Counter
from .source_base import Source, append_record, check_claimed_count, even_parts, field_record

# Features `datasets` stores as a struct of the encoded file's bytes and its original path.
_ENCODED_FILE_FEATURES = ("Image", "Audio")
_PARQUET_BATCH_ROWS = 4096
_DATASET_BATCH_ROWS = 1024  # the rows of a Dataset object read at a time


def _pyarrow() -> Any:
    return require_extra("pyarrow", "hf", "converting Hugging Face datasets")


class HuggingFaceSource(Source):
    """A ``save_to_disk`` folder, an ``.arrow`` file or a ``.parquet`` file written by `datasets`.

    Its pieces are the files' record batches (Arrow) and row groups (Parquet), in order; ``--workers`` splits
    them into contiguous parts.
    """

    unit = "row"

    def __init__(self, path: str, field: str | None, codec: str | None, *, skip_null: bool) -> None:
        self.path, self.field, self.skip_null = path, field, skip_null
        pa = _pyarrow()
        self._read_errors = (pa.ArrowException, OSError)
        self.files = _data_files(path)
        schema, self.pieces = None, []  # pieces: (file position, batch or row group, rows)
        for position, file in enumerate(self.files):
            try:
                file_schema, rows = self._open(file).schema_and_rows()
            except self._read_errors as error:
                raise CommandError(f"{file}: not an Arrow or Parquet file pyarrow can read: {error}") from None
            if schema is not None and not file_schema.equals(schema, check_metadata=False):
                raise CommandError(f"{file}: its columns differ from those of {self.files[0]}: {file_schema} "
                                   f"against {schema}")
            schema = file_schema
            self.pieces += [(position, piece, count) for piece, count in enumerate(rows)]
        assert schema is not None
        self.total = sum(count for _, _, count in self.pieces)
        self.features = _features(schema, self.files[0])
        self.metadata = {"huggingface_features": self.features} if self.features else {}
        self.column = _RecordColumns(schema, self.features, field, codec, skip_null, path)
        self.codec, self.dtype = self.column.codec, self.column.dtype

    def _open(self, file: str) -> _ArrowFile | _ParquetFile:
        return _ParquetFile(file) if file.endswith(".parquet") else _ArrowFile(file)

    def whole(self) -> dict[str, Any]:
        return {"first": 0, "stop": len(self.pieces), "row": 0}

    def split(self, count: int) -> list[dict[str, Any]]:
        """Parts of consecutive record batches or row groups, each with the number of its first row."""
        return [{**part, "row": sum(rows for _, _, rows in self.pieces[: part["first"]])}
                for part in even_parts(count, len(self.pieces))]

    def write_part(self, writer: ShardedWriter, progress: Counter, part: dict[str, Any]) -> None:
        row, pieces = part["row"], self.pieces[part["first"] : part["stop"]]
        for position in sorted({position for position, _, _ in pieces}):
            file = self.files[position]
            taken = [piece for at, piece, _ in pieces if at == position]
            try:
                for batch in self._open(file).batches(taken[0], taken[-1] + 1):
                    self.skipped += self.column.write_batch(writer, batch, f"{file}, row", row)
                    row += batch.num_rows
                    progress(batch.num_rows)
            except self._read_errors as error:
                raise CommandError(f"{file}, from row {row}: pyarrow cannot read it: {error}") from None


class _ArrowFile:
    """An Arrow IPC file as `datasets` writes it (the streaming format; the random-access one is read too),
    memory-mapped: a record batch is read when asked for, without copying."""

    def __init__(self, path: str) -> None:
        pa = _pyarrow()
        self.path, self.map = path, pa.memory_map(path, "r")
        try:
            pa.ipc.open_stream(self.map)
            self.random_access = False
        except pa.ArrowInvalid:
            pa.ipc.open_file(self.map)
            self.random_access = True

    def _reader(self) -> Any:
        self.map.seek(0)
        ipc = _pyarrow().ipc
        return ipc.open_file(self.map) if self.random_access else ipc.open_stream(self.map)

    def schema_and_rows(self) -> tuple[Any, list[int]]:
        """The schema and the row count of each record batch (read through the map: nothing is copied)."""
        reader = self._reader()
        if self.random_access:
            return reader.schema, [reader.get_batch(i).num_rows for i in range(reader.num_record_batches)]
        return reader.schema, [batch.num_rows for batch in reader]

    def batches(self, first: int, stop: int) -> Iterator[Any]:
        """Record batches `first` to `stop` (a stream is read from its start: its batches are found in order)."""
        reader = self._reader()
        if self.random_access:
            yield from (reader.get_batch(piece) for piece in range(first, stop))
            return
        for piece, batch in enumerate(reader):
            if piece >= stop:
                return
            if piece >= first:
                yield batch


class _ParquetFile:
    """A Parquet file whose pieces are its row groups, each read in batches of rows."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.file = require_extra("pyarrow.parquet", "hf", "converting Hugging Face datasets").ParquetFile(path)
        check_claimed_count(path, self.file.metadata.num_rows, f"its metadata claims {self.file.metadata.num_rows:,} rows")

    def schema_and_rows(self) -> tuple[Any, list[int]]:
        return self.file.schema_arrow, [self.file.metadata.row_group(i).num_rows for i in range(self.file.num_row_groups)]

    def batches(self, first: int, stop: int) -> Iterator[Any]:
        """The rows of row groups `first` to `stop`, in batches."""
        return self.file.iter_batches(batch_size=_PARQUET_BATCH_ROWS, row_groups=list(range(first, stop)))


def _data_files(path: str) -> list[str]:
    """The Arrow or Parquet files of `path`: the file itself, or those a ``save_to_disk`` folder's state.json lists."""
    if not os.path.isdir(path):
        if not path.endswith((".arrow", ".parquet")):
            raise UsageError(f"{path}: a Hugging Face source is a save_to_disk folder, an .arrow or a .parquet file")
        return [path]
    if os.path.exists(os.path.join(path, "dataset_dict.json")):
        splits = sorted(entry.name for entry in os.scandir(path) if entry.is_dir())
        raise UsageError(f"{path}: a DatasetDict of splits ({', '.join(splits)}); convert one split's folder, "
                         f"e.g. {os.path.join(path, splits[0] if splits else 'train')}")
    state_path = os.path.join(path, "state.json")
    try:
        with open(state_path, encoding="utf-8") as file:
            names = [entry["filename"] for entry in json.load(file)["_data_files"]]
    except FileNotFoundError:
        raise CommandError(f"{path}: no state.json: not a folder written by datasets' save_to_disk") from None
    except (ValueError, KeyError, TypeError) as error:
        raise CommandError(f"{state_path}: not the state.json save_to_disk writes (its _data_files list of "
                           f"filenames): {error!r}") from None
    for name in names:
        if not isinstance(name, str) or os.path.basename(name) != name or name in ("", ".", ".."):
            raise CommandError(f"{state_path}: the data file {name!r} is not a file name in the folder")
        if not os.path.isfile(os.path.join(path, name)):
            raise CommandError(f"{state_path}: lists {name}, which is not in {path}")
    if not names:
        raise CommandError(f"{state_path}: lists no data file")
    return [os.path.join(path, name) for name in names]


def _features(schema: Any, where: str) -> dict[str, Any]:
    """The features `datasets` wrote in the schema's metadata ({} for a file written without it)."""
    stored = (schema.metadata or {}).get(b"huggingface")
    if stored is None:
        return {}
    try:
        features = json.loads(stored)["info"]["features"]
    except (ValueError, KeyError, TypeError) as error:
        raise CommandError(f"{where}: its huggingface schema metadata is not the features datasets writes: {error!r}") from None
    if not isinstance(features, dict):
        raise CommandError(f"{where}: its huggingface schema metadata holds features that are not a map")
    return features


def _is_list(type_: Any) -> bool:
    pa = _pyarrow()
    return pa.types.is_list(type_) or pa.types.is_large_list(type_) or pa.types.is_fixed_size_list(type_)


def _is_number(type_: Any) -> bool:
    pa = _pyarrow()
    return pa.types.is_integer(type_) or pa.types.is_floating(type_)


def _is_encoded_file(feature: Any, type_: Any) -> bool:
    pa = _pyarrow()
    return (isinstance(feature, dict) and feature.get("_type") in _ENCODED_FILE_FEATURES
            and pa.types.is_struct(type_) and type_.get_field_index("bytes") >= 0)


def _list_offsets(array: Any) -> np.ndarray:
    """The boundaries of each list of `array` in its (unsliced) values."""
    if _pyarrow().types.is_fixed_size_list(array.type):
        return (array.offset + np.arange(len(array) + 1, dtype=np.int64)) * array.type.list_size
    return array.offsets.to_numpy()


def column_values(array: Any, feature: Any, where: str, first_row: int) -> list[Any]:
    """The Python values of an Arrow array as records hold them: lists of numbers as numpy arrays, encoded files
    as their bytes; `where` and `first_row` name a row in an error."""
    if _is_encoded_file(feature, array.type):
        data = array.field("bytes") if array.offset == 0 else array.flatten()[array.type.get_field_index("bytes")]
        values = data.to_pylist()
        for row, (value, valid) in enumerate(zip(values, array.is_valid().to_pylist()), first_row):
            if value is None and valid:
                raise CommandError(f"{where} {row}: the {feature['_type']} holds no bytes, only a path; convert "
                                   "stores embedded files (save_to_disk embeds them)")
        return values
    if _is_list(array.type):
        child = array.values
        if _is_number(child.type) and child.null_count == 0:
            pieces: Any = child.to_numpy(zero_copy_only=False)
        else:
            pieces = column_values(child, feature.get("feature") if isinstance(feature, dict) else None, where, first_row)
        offsets = _list_offsets(array)
        valid = array.is_valid().to_numpy(zero_copy_only=False)
        return [pieces[start:stop] if present else None
                for start, stop, present in zip(offsets[:-1].tolist(), offsets[1:].tolist(), valid)]
    if _pyarrow().types.is_struct(array.type):
        children = array.flatten()
        names = [array.type.field(i).name for i in range(array.type.num_fields)]
        columns = [column_values(child, feature.get(name) if isinstance(feature, dict) else None, where, first_row)
                   for name, child in zip(names, children)]
        valid = array.is_valid().to_pylist()
        return [dict(zip(names, row)) if present else None for present, row in zip(valid, zip(*columns))]
    return array.to_pylist()


class _RecordColumns:
    """How a batch's rows become records: whole rows as msgpack maps, or the one column `field`."""

    def __init__(self, schema: Any, features: dict[str, Any], field: str | None, codec: str | None,
                 skip_null: bool, path: str) -> None:
        self.features, self.field, self.skip_null = features, field, skip_null
        self.dtype: np.dtype | None = None
        if field is None:
            if codec is not None or skip_null:
                option = "--codec" if codec is not None else "--skip-null"
                raise UsageError(f"{option} applies to Hugging Face sources only with --field; whole rows are msgpack")
            self.codec = "msgpack"
            return
        if field not in schema.names:
            raise UsageError(f"{path} has no column {field!r}; its columns are {', '.join(schema.names)}")
        type_ = schema.field(field).type
        pa = _pyarrow()
        if _is_list(type_) and _is_number(type_.value_type):
            if codec is not None:
                raise UsageError(f"--codec does not apply to the column {field!r}, a list of numbers stored as ndarray")
            self.codec, self.dtype = "ndarray", canonical_dtype(type_.value_type.to_pandas_dtype())
        elif pa.types.is_string(type_) or pa.types.is_large_string(type_):
            self.codec = codec or "str"
        elif pa.types.is_binary(type_) or pa.types.is_large_binary(type_) or _is_encoded_file(features.get(field), type_):
            if codec == "str":
                raise UsageError(f"--codec str does not apply to the binary column {field!r}")
            self.codec = "bytes"
        else:
            raise UsageError(f"{path}: the column {field!r} is {type_}; --field takes a text, binary, image or audio "
                             "column, or a list of numbers")

    def write_batch(self, writer: ShardedWriter, batch: Any, where: str, first_row: int) -> int:
        """Append the records of `batch`, whose first row is `first_row`; returns how many rows were left out."""
        if self.field is not None:
            values = column_values(batch.column(self.field), self.features.get(self.field), where, first_row)
            skipped = 0
            for row, value in enumerate(values, first_row):
                if value is None and self.skip_null:
                    skipped += 1
                elif self.codec == "ndarray" and value is not None:
                    append_record(writer, value, f"{where} {row}")
                else:
                    append_record(writer, field_record(value, self.codec, f"{where} {row}, column {self.field!r}"), f"{where} {row}")
            return skipped
        names = batch.schema.names
        columns = [column_values(batch.column(i), self.features.get(name), where, first_row) for i, name in enumerate(names)]
        for row, values in enumerate(zip(*columns), first_row):
            append_record(writer, dict(zip(names, values)), f"{where} {row}")
        return 0


def convert_huggingface(
    dataset: Any,
    destination: str | os.PathLike[str],
    *,
    field: str | None = None,
    codec: str | None = None,
    skip_null: bool = False,
    metadata: dict[str, Any] | None = None,
    overwrite: bool = False,
    **writer_options: Any,
) -> int:
    """Write a `datasets.Dataset` object (in memory, selected, shuffled or on disk) to `destination`, its rows in
    its order, as `convert` writes a Hugging Face source; returns the number of records. `writer_options` are
    `ShardedWriter`'s (``max_shard_bytes``, ``compression``...). A folder or file on disk converts faster with
    ``convert(path, destination, format="huggingface", workers=N)``."""
    try:
        table_batches = dataset.with_format("arrow").iter(batch_size=_DATASET_BATCH_ROWS)
        schema = dataset.data.schema
        features = dataset.features.to_dict()
        columns = _RecordColumns(schema, features, field, codec, skip_null, "the dataset")
        user_metadata = metadata or {}
        if "huggingface_features" in user_metadata:
            raise UsageError("metadata sets huggingface_features, which the conversion writes itself")
        with ShardedWriter(destination, codec=columns.codec, dtype=columns.dtype, overwrite=overwrite,
                           metadata={"huggingface_features": features, **user_metadata}, **writer_options) as writer:
            row = 0
            for table in table_batches:
                for batch in table.to_batches():
                    columns.write_batch(writer, batch, "the dataset, row", row)
                    row += batch.num_rows
        return len(writer)
    except CommandError as error:
        raise VarstoreError(str(error)) from None

"""The compression benchmark's peers (tools/bench/compression.py): each stores a corpus of byte records with the
library's own compression, and reads records back by index.

- varstore with each ``compression`` (none, ``zstd``, ``zstd-dict``, ``zstd-blocks``, ``zstd-dict-blocks``,
  ``auto``) at level 3, one shard; for each compressed shard, the floor of its reads: python-zstandard's own
  ``decompress`` of the frame a record is read from (`bare_decoding`);
- MDS with zstd shards (``MDSWriter(compression="zstd:3")``, its default 64 MiB shards);
- litdata with zstd chunks (``optimize(compression="zstd")``, its default level, 64 MB chunks);
- ArrayRecord, zstd level 3, with groups of 1 record (one frame per record) and of 65,536 (the C++ writer's
  default group size; the Python binding's empty options give groups of 1);
- Bagz with per-record zstd level 3;
- Lance, one ``large_binary`` column with the ``zstd`` compression field metadata, read by ``take``, in its
  file format 2.1 (pylance 14's default) and 2.0 (which stores small values far smaller).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any, Callable

import numpy as np

from .base import Peer, Store
from .varstore_shard import SHARD_NAME, VarstoreStore

LEVEL = 3
COLUMN = "payload"


class CompressedPeer(Peer):
    """A peer of the compression benchmark: `write` takes the corpus's records (bytes); `workload` is unused."""

    def write_records(self, records: list[bytes], directory: str) -> None:
        raise NotImplementedError

    def write(self, workload: Any, records: list[Any], directory: str) -> None:
        self.write_records(records, directory)

    def open_records(self, directory: str) -> Store:
        raise NotImplementedError

    def open(self, directory: str, workload: Any = None, advice: str | None = None) -> Store:
        return self.open_records(directory)


class VarstoreCompressed(CompressedPeer):
    native_batch = True

    def __init__(self, compression: str | None) -> None:
        self.compression = compression
        self.name = "varstore" if compression is None else f"varstore-{compression}"
        self.label = f"varstore {compression or 'uncompressed'}"

    def write_records(self, records: list[bytes], directory: str) -> None:
        import varstore

        with varstore.Writer(os.path.join(directory, SHARD_NAME), compression=self.compression,
                             compression_level=LEVEL) as writer:
            writer.extend(records)

    def open_records(self, directory: str) -> Store:
        return VarstoreStore(directory, None)


def bare_decoding(store: VarstoreStore, indices: list[int]) -> tuple[Callable[[bytes], bytes], list[bytes]]:
    """What python-zstandard alone does for a compressed varstore shard's reads of `indices`: its ``decompress``
    (one context, the shard's dictionary loaded once) and, as bytes copied out of the data file, the stored frame
    each read decodes: the record's own (format 2.x) or its block's (3.x, spec §1.7)."""
    import zstandard

    reader = store.reader
    header = reader.header
    blocks = reader._blocks  # the reader's parsed index: the bench reads where its frames are, not how it checks them
    if blocks is None:
        numbers, bounds = np.asarray(indices, np.int64), reader._offsets
    else:
        numbers = np.searchsorted(blocks.block_records, np.asarray(indices, np.uint64), "right") - 1
        bounds = blocks.block_offsets
    data = reader._data_map
    frames = [data[int(bounds[number]) : int(bounds[number + 1])] for number in numbers.tolist()]
    options: dict[str, Any] = {}
    if header.dictionary_size:
        dictionary = reader._index_map[header.dictionary_start : header.dictionary_start + header.dictionary_size]
        options["dict_data"] = zstandard.ZstdCompressionDict(dictionary, dict_type=zstandard.DICT_TYPE_FULLDICT)
    return zstandard.ZstdDecompressor(**options).decompress, frames


class _ListStore(Store):
    """A store read through a library's get-by-index and batch calls."""

    def __init__(self, count: int, get: Any, get_batch: Any, close: Any = None) -> None:
        self._count, self.get, self._get_batch, self._close = count, get, get_batch, close  # type: ignore[method-assign]

    def get_batch(self, indices: np.ndarray) -> Any:
        return self._get_batch(indices.tolist())

    def scan(self) -> Iterator[Any]:
        return (self.get(index) for index in range(self._count))

    def __len__(self) -> int:
        return self._count

    def close(self) -> None:
        if self._close is not None:
            self._close()
        self.get = self._get_batch = self._close = None  # type: ignore[assignment]


class MDSZstd(CompressedPeer):
    name, label = "mds-zstd", "MDS, zstd shards"

    def write_records(self, records: list[bytes], directory: str) -> None:
        from .mds import streaming

        with streaming.MDSWriter(out=directory, columns={COLUMN: "bytes"}, compression=f"zstd:{LEVEL}") as writer:
            for record in records:
                writer.write({COLUMN: record})

    def open_records(self, directory: str) -> Store:
        from .mds import streaming

        dataset = streaming.StreamingDataset(local=directory, batch_size=256, shuffle=False)
        def get(index: int) -> bytes:
            return dataset[index][COLUMN]

        return _ListStore(len(dataset), get, lambda indices: [get(index) for index in indices])


_LITDATA_RECORDS: list[bytes] = []  # the corpus, for optimize's forked worker
_LITDATA_INPUT = 1000


def _litdata_input(first: int) -> Iterator[bytes]:
    yield from _LITDATA_RECORDS[first : first + _LITDATA_INPUT]


class LitdataZstd(CompressedPeer):
    name, label = "litdata-zstd", "litdata, zstd chunks"

    def write_records(self, records: list[bytes], directory: str) -> None:
        import litdata

        _LITDATA_RECORDS[:] = records
        litdata.optimize(fn=_litdata_input, inputs=list(range(0, len(records), _LITDATA_INPUT)), output_dir=directory,
                         chunk_bytes="64MB", compression="zstd", num_workers=1, start_method="fork",
                         mode="overwrite", verbose=False)

    def open_records(self, directory: str) -> Store:
        import litdata

        dataset = litdata.StreamingDataset(directory)
        return _ListStore(len(dataset), dataset.__getitem__, lambda indices: [dataset[index] for index in indices])


class ArrayRecord(CompressedPeer):
    def __init__(self, group_size: int) -> None:
        self.group_size = group_size
        self.name, self.label = f"arrayrecord-g{group_size}", f"ArrayRecord, groups of {group_size}"

    def write_records(self, records: list[bytes], directory: str) -> None:
        from array_record.python import array_record_module

        writer = array_record_module.ArrayRecordWriter(os.path.join(directory, "records.array_record"),
                                                       f"group_size:{self.group_size},zstd:{LEVEL}")
        for record in records:
            writer.write(record)
        writer.close()

    def open_records(self, directory: str) -> Store:
        from array_record.python import array_record_module

        # The options its documentation gives for random access.
        reader = array_record_module.ArrayRecordReader(os.path.join(directory, "records.array_record"),
                                                       "readahead_buffer_size:0,max_parallelism:0")
        return _ListStore(reader.num_records(), lambda index: reader.read([index])[0], reader.read, reader.close)


class Bagz(CompressedPeer):
    name, label = "bagz-zstd", "Bagz, per-record zstd"

    def write_records(self, records: list[bytes], directory: str) -> None:
        import bagz

        options = bagz.Writer.Options(compression=bagz.CompressionZstd(level=LEVEL))
        with bagz.Writer(os.path.join(directory, "records.bagz"), options) as writer:
            for record in records:
                writer.write(record)

    def open_records(self, directory: str) -> Store:
        import bagz

        reader = bagz.Reader(os.path.join(directory, "records.bagz"))
        return _ListStore(len(reader), reader.__getitem__, reader.read_indices)


class Lance(CompressedPeer):
    def __init__(self, file_version: str) -> None:
        self.file_version = file_version
        self.name, self.label = f"lance-{file_version}", f"Lance, file format {file_version}, zstd"

    def write_records(self, records: list[bytes], directory: str) -> None:
        import lance
        import pyarrow as pa

        field = pa.field(COLUMN, pa.large_binary(), metadata={"lance-encoding:compression": "zstd"})
        lance.write_dataset(pa.table({COLUMN: pa.array(records, pa.large_binary())}, schema=pa.schema([field])),
                            directory, mode="overwrite", data_storage_version=self.file_version)

    def open_records(self, directory: str) -> Store:
        import lance

        dataset = lance.dataset(directory)

        def get_batch(indices: list[int]) -> list[bytes]:
            return dataset.take(indices, columns=[COLUMN]).column(COLUMN).to_pylist()

        return _ListStore(dataset.count_rows(), lambda index: get_batch([index])[0], get_batch)


PEERS: dict[str, CompressedPeer] = {peer.name: peer for peer in (
    VarstoreCompressed(None), VarstoreCompressed("zstd"), VarstoreCompressed("zstd-dict"),
    VarstoreCompressed("zstd-blocks"), VarstoreCompressed("zstd-dict-blocks"), VarstoreCompressed("auto"),
    MDSZstd(), LitdataZstd(), ArrayRecord(1), ArrayRecord(65536), Bagz(), Lance("2.1"), Lance("2.0"),
)}

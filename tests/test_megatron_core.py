"""Megatron data in place, both ways, checked by megatron-core itself (the dev extra installs it): what its
`IndexedDatasetBuilder` writes, varstore reads as the same sequences; what `export_megatron` writes, its
`IndexedDataset` reads as varstore's records; for every Megatron dtype."""

from __future__ import annotations

import os

import numpy as np
import pytest

import varstore
from varstore.conversion.megatron import export_megatron, import_megatron

indexed_dataset = pytest.importorskip("megatron.core.datasets.indexed_dataset")
torch = pytest.importorskip("torch")

DTYPES = [np.uint8, np.int8, np.int16, np.int32, np.int64, np.float64, np.float32, np.uint16]


def documents_of(dtype) -> list[list[np.ndarray]]:
    """Documents of sequences, an empty sequence and a document of none among them, with each dtype's extremes."""
    info = np.finfo(dtype) if np.dtype(dtype).kind == "f" else np.iinfo(dtype)
    extremes = np.array([info.min, 0, info.max], dtype)
    return [[extremes, np.array([], dtype)], [], [np.arange(5).astype(dtype)], [np.array([7], dtype)] * 3]


def build_with_megatron(prefix: str, dtype, documents: list[list[np.ndarray]]) -> None:
    builder = indexed_dataset.IndexedDatasetBuilder(prefix + ".bin", dtype=dtype)
    for document in documents:
        for sequence in document:
            builder.add_item(torch.from_numpy(sequence.copy()))
        builder.end_document()
    builder.finalize(prefix + ".idx")


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda dtype: dtype.__name__)
def test_varstore_reads_what_megatrons_builder_wrote(tmp_path, dtype):
    documents = documents_of(dtype)
    build_with_megatron(str(tmp_path / "corpus"), dtype, documents)
    made = import_megatron(tmp_path / "corpus", tmp_path / "dataset", checksums=True)
    sequences = [sequence for document in documents for sequence in document]
    assert (made.sequences, made.documents) == (len(sequences), len(documents))
    megatron = indexed_dataset.IndexedDataset(str(tmp_path / "corpus"))
    with varstore.open(tmp_path / "dataset", verify_reads=True) as reader:
        assert reader.dtype == np.dtype(dtype) and len(reader) == len(megatron) == len(sequences)
        for position, sequence in enumerate(sequences):
            assert reader[position].tobytes() == megatron[position].tobytes() == sequence.tobytes()


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda dtype: dtype.__name__)
def test_megatrons_indexed_dataset_reads_what_varstore_exported(tmp_path, dtype):
    records = [sequence for document in documents_of(dtype) for sequence in document]
    with varstore.ShardedWriter(tmp_path / "dataset", "ndarray", dtype=dtype) as writer:
        writer.extend(records)
    export_megatron(tmp_path / "dataset", tmp_path / "exported")
    megatron = indexed_dataset.IndexedDataset(str(tmp_path / "exported"))
    assert megatron.index.dtype == dtype and len(megatron) == len(records)
    for position, record in enumerate(records):
        assert megatron[position].tobytes() == record.tobytes()
    assert megatron.document_indices.tolist() == list(range(len(records) + 1))  # one document per record


def test_megatron_documents_survive_import_and_export(tmp_path):
    documents = documents_of(np.uint16)
    build_with_megatron(str(tmp_path / "corpus"), np.uint16, documents)
    import_megatron(tmp_path / "corpus", tmp_path / "dataset")
    export_megatron(tmp_path / "dataset", tmp_path / "exported")
    original = indexed_dataset.IndexedDataset(str(tmp_path / "corpus"))
    exported = indexed_dataset.IndexedDataset(str(tmp_path / "exported"))
    assert exported.document_indices.tolist() == original.document_indices.tolist() == [0, 2, 2, 3, 6]
    assert exported.sequence_lengths.tolist() == original.sequence_lengths.tolist()
    assert os.stat(tmp_path / "exported.bin").st_ino == os.stat(tmp_path / "corpus.bin").st_ino

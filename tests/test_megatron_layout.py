"""`varstore import megatron` / `export megatron` against Megatron's documented ``.idx`` layout, written here from
megatron-core's description (not its code): every dtype, empty sequences and documents, lying indexes, links.
tests/test_megatron_core.py checks the same against megatron-core itself."""

from __future__ import annotations

import os
import struct
import tempfile

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import varstore
from varstore.cli import main
from varstore.conversion import megatron
from varstore.conversion.megatron import export_megatron, import_megatron
from varstore.errors import CommandError, FormatError, StorageError
from varstore.operations.verify import verify

# Megatron's dtype codes, as megatron-core's DType enum numbers them.
MEGATRON_CODES = {"uint8": 1, "int8": 2, "int16": 3, "int32": 4, "int64": 5, "float64": 6, "float32": 7, "uint16": 8}


def write_megatron(prefix: str, sequences: list[np.ndarray], dtype: str, document_indices: list[int] | None = None) -> None:
    """``prefix.bin`` and ``prefix.idx`` as Megatron lays them out: header, int32 lengths, int64 byte pointers,
    int64 document indices (0, ..., S when None: one document per sequence)."""
    itemsize = np.dtype(dtype).itemsize
    lengths = [len(sequence) for sequence in sequences]
    pointers, position = [], 0
    for length in lengths:
        pointers.append(position)
        position += length * itemsize
    if document_indices is None:
        document_indices = list(range(len(sequences) + 1))
    with open(prefix + ".bin", "wb") as file:
        file.writelines(np.asarray(sequence, dtype).tobytes() for sequence in sequences)
    with open(prefix + ".idx", "wb") as file:
        file.write(b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, MEGATRON_CODES[dtype], len(sequences), len(document_indices)))
        file.write(struct.pack(f"<{len(lengths)}i", *lengths))
        file.write(struct.pack(f"<{len(pointers)}q", *pointers))
        file.write(struct.pack(f"<{len(document_indices)}q", *document_indices))


def read_megatron(prefix: str) -> tuple[str, list[np.ndarray], list[int]]:
    """(dtype name, sequences, document indices) of a Megatron dataset, read by the documented layout."""
    with open(prefix + ".idx", "rb") as file:
        raw = file.read()
    code, sequences, documents = struct.unpack_from("<BQQ", raw, 17)
    dtype = {code: name for name, code in MEGATRON_CODES.items()}[code]
    lengths = struct.unpack_from(f"<{sequences}i", raw, 34)
    pointers = struct.unpack_from(f"<{sequences}q", raw, 34 + 4 * sequences)
    document_indices = list(struct.unpack_from(f"<{documents}q", raw, 34 + 12 * sequences))
    assert len(raw) == 34 + 12 * sequences + 8 * documents
    data = np.fromfile(prefix + ".bin", dtype)
    itemsize = np.dtype(dtype).itemsize
    return dtype, [data[p // itemsize: p // itemsize + n] for p, n in zip(pointers, lengths)], document_indices


def sample_sequences(dtype: str) -> list[np.ndarray]:
    info = np.finfo(dtype) if np.dtype(dtype).kind == "f" else np.iinfo(dtype)
    return [np.array([info.min, 0, info.max], dtype), np.array([], dtype), np.array([1], dtype), np.array([], dtype)]


@pytest.mark.parametrize("dtype", sorted(MEGATRON_CODES))
def test_every_megatron_dtype_imports_as_its_sequences_with_the_bin_linked(tmp_path, dtype):
    sequences = sample_sequences(dtype)
    write_megatron(str(tmp_path / "corpus"), sequences, dtype)
    made = import_megatron(tmp_path / "corpus", tmp_path / "dataset")
    assert (made.sequences, made.documents, made.linked) == (4, 4, True)
    with varstore.open(tmp_path / "dataset") as reader:
        assert reader.dtype == np.dtype(dtype) and len(reader) == 4
        for record, sequence in zip(reader, sequences):
            np.testing.assert_array_equal(record, sequence)
        assert reader.metadata == {"megatron": {"documents": 4, "document_indices": "one per sequence"}}
    assert os.stat(tmp_path / "corpus.bin").st_ino == os.stat(tmp_path / "dataset" / "shard-000000.data").st_ino
    assert verify(str(tmp_path / "dataset")).ok


@pytest.mark.parametrize("dtype", sorted(MEGATRON_CODES))
def test_export_writes_the_idx_megatron_wrote_for_every_dtype(tmp_path, dtype):
    write_megatron(str(tmp_path / "corpus"), sample_sequences(dtype), dtype, [0, 2, 2, 4])  # one empty document
    import_megatron(tmp_path / "corpus", tmp_path / "dataset")
    export_megatron(tmp_path / "dataset", tmp_path / "back")
    assert (tmp_path / "back.idx").read_bytes() == (tmp_path / "corpus.idx").read_bytes()
    assert os.stat(tmp_path / "back.bin").st_ino == os.stat(tmp_path / "corpus.bin").st_ino


def test_document_indices_other_than_one_per_sequence_live_in_a_side_shard(tmp_path):
    sequences = [np.arange(n, dtype=np.uint16) for n in (3, 0, 2, 5)]
    write_megatron(str(tmp_path / "corpus"), sequences, "uint16", [0, 2, 2, 4])
    made = import_megatron(tmp_path / "corpus", tmp_path / "dataset")
    assert made.documents == 3
    with varstore.open(tmp_path / "dataset") as reader:
        assert reader.metadata == {"megatron": {"documents": 3, "document_indices": "megatron-document-indices"}}
    with varstore.open(tmp_path / "dataset" / "megatron-document-indices") as side:
        assert side[0].tolist() == [0, 2, 2, 4]


def test_checksums_store_each_records_crc_and_verify_reads_pass(tmp_path):
    sequences = [np.arange(n, dtype=np.int32) * 7 for n in (1, 0, 4000, 3)]
    write_megatron(str(tmp_path / "corpus"), sequences, "int32")
    import_megatron(tmp_path / "corpus", tmp_path / "dataset", checksums=True)
    with varstore.open(tmp_path / "dataset", verify_reads=True) as reader:
        assert [record.tolist() for record in reader] == [sequence.tolist() for sequence in sequences]
    assert verify(str(tmp_path / "dataset")).ok


def test_the_one_checksum_pass_is_right_across_its_steps(tmp_path, monkeypatch):
    """Records smaller and larger than the pass's step, empty ones at its edges: each CRC and the data CRC hold."""
    monkeypatch.setattr(megatron, "_CRC_CHUNK_BYTES", 64)
    sequences = [np.arange(n, dtype=np.int64) for n in (0, 3, 8, 0, 9, 100, 1, 0, 7, 8, 0)]
    write_megatron(str(tmp_path / "corpus"), sequences, "int64")
    import_megatron(tmp_path / "corpus", tmp_path / "dataset", checksums=True)
    assert verify(str(tmp_path / "dataset")).ok
    with varstore.open(tmp_path / "dataset", verify_reads=True) as reader:
        assert [record.tolist() for record in reader] == [sequence.tolist() for sequence in sequences]


def test_a_record_changed_after_import_fails_verification(tmp_path):
    """With data_crc the header's data checksum is the .bin's own: a token changed after the import is found."""
    write_megatron(str(tmp_path / "corpus"), [np.arange(10000, dtype=np.uint16)], "uint16")
    import_megatron(tmp_path / "corpus", tmp_path / "dataset", data_crc=True)
    with open(tmp_path / "corpus.bin", "r+b") as file:  # the same inode as the dataset's data file
        file.seek(9000)
        file.write(b"\xff")
    assert not verify(str(tmp_path / "dataset")).ok


def test_import_across_filesystems_copies_and_says_so(tmp_path):
    if not os.path.isdir("/dev/shm") or os.stat("/dev/shm").st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("needs /dev/shm on another filesystem than the test's directory")
    write_megatron(str(tmp_path / "corpus"), [np.arange(5, dtype=np.uint8)], "uint8")
    with tempfile.TemporaryDirectory(dir="/dev/shm") as other:
        made = import_megatron(tmp_path / "corpus", os.path.join(other, "dataset"))
        assert not made.linked
        with varstore.open(os.path.join(other, "dataset")) as reader:
            assert reader[0].tolist() == [0, 1, 2, 3, 4]


def _lie(tmp_path, position: int, fmt: str, value: int) -> str:
    """A valid 3-sequence corpus whose .idx then has `value` packed as `fmt` at byte `position`."""
    prefix = str(tmp_path / "corpus")
    write_megatron(prefix, [np.arange(4, dtype=np.uint16), np.arange(2, dtype=np.uint16), np.arange(3, dtype=np.uint16)], "uint16")
    with open(prefix + ".idx", "r+b") as file:
        raw = bytearray(file.read())
        struct.pack_into(fmt, raw, position, value)
        file.seek(0)
        file.write(raw)
    return prefix


@pytest.mark.parametrize("position, fmt, value, field", [
    (0, "<B", ord("X"), "magic"),
    (9, "<Q", 2, "version"),
    (17, "<B", 9, "dtype code"),
    (17, "<B", 0, "dtype code"),
    (18, "<Q", 1 << 63, "sequence count"),
    (18, "<Q", 6, "sequence count is 6"),  # lengths and pointers alone would overrun the file
    (18, "<Q", 4, "after the lengths and pointers of 4 sequences"),  # one more: no room left for the documents
    (26, "<Q", (1 << 64) - 1, "document count"),
    (34 + 4 * 1, "<i", -1, "sequence_lengths[1]"),
    (34 + 4 * 2, "<i", 4, "sequence_lengths cover"),  # past the end of the .bin
    (34 + 12 + 8 * 2, "<q", 1 << 40, "sequence_pointers[2]"),  # pointer past the end
    (34 + 12 + 8 * 1, "<q", 6, "sequence_pointers[1]"),  # overlapping the sequence before it
    (34 + 36, "<q", 1, "document_indices"),  # not starting at 0
    (34 + 36 + 8 * 3, "<q", 2, "document_indices"),  # not ending at the sequence count
    (34 + 36 + 8 * 2, "<q", 0, "document_indices[2]"),  # falling
])
def test_an_idx_that_lies_is_refused_naming_the_file_and_field_and_leaves_nothing(tmp_path, position, fmt, value, field):
    prefix = _lie(tmp_path, position, fmt, value)
    with pytest.raises(FormatError) as refused:
        import_megatron(prefix, tmp_path / "dataset")
    assert prefix + ".idx" in str(refused.value) and field in str(refused.value)
    assert not (tmp_path / "dataset").exists()


def test_an_import_failing_at_its_commit_removes_every_file_it_wrote(tmp_path, monkeypatch):
    def refuse(*args, **kwargs):
        raise StorageError("the disk is full", path=str(tmp_path / "dataset"))

    monkeypatch.setattr(megatron, "write_manifest", refuse)
    write_megatron(str(tmp_path / "corpus"), [np.arange(3, dtype=np.uint8)] * 3, "uint8", [0, 2, 3])  # a side shard too
    with pytest.raises(StorageError, match="disk is full"):
        import_megatron(tmp_path / "corpus", tmp_path / "dataset")
    assert not (tmp_path / "dataset").exists()
    assert (tmp_path / "corpus.bin").read_bytes() == bytes([0, 1, 2] * 3)


def test_a_bin_that_grows_after_its_idx_was_checked_is_refused(tmp_path, monkeypatch):
    checked = megatron.read_megatron_index

    def check_then_grow(idx_path, bin_size):
        index = checked(idx_path, bin_size)
        with open(tmp_path / "corpus.bin", "ab") as file:
            file.write(bytes(2))  # a writer appending one more token
        return index

    monkeypatch.setattr(megatron, "read_megatron_index", check_then_grow)
    write_megatron(str(tmp_path / "corpus"), [np.arange(3, dtype=np.uint16)], "uint16")
    with pytest.raises(FormatError, match="is 8 bytes now, 6 when its .idx was checked"):
        import_megatron(tmp_path / "corpus", tmp_path / "dataset")
    assert not (tmp_path / "dataset").exists()


def test_a_multimodal_idx_is_refused_naming_its_sequence_modes(tmp_path):
    prefix = _lie(tmp_path, 0, "<B", 0x4D)  # unchanged: "M"
    with open(prefix + ".idx", "ab") as file:
        file.write(bytes(3))  # one int8 mode per sequence
    with pytest.raises(FormatError, match="sequence modes"):
        import_megatron(prefix, tmp_path / "dataset")


def test_export_refuses_a_dataset_of_several_shards_naming_one_to_export(tmp_path):
    with varstore.ShardedWriter(tmp_path / "dataset", "ndarray", dtype="uint16", max_shard_records=2) as writer:
        writer.extend([np.arange(3, dtype=np.uint16)] * 5)
    with pytest.raises(CommandError, match="3 shards.*shard-000001"):
        export_megatron(tmp_path / "dataset", tmp_path / "out")
    export_megatron(tmp_path / "dataset" / "shard-000001", tmp_path / "out")
    assert [s.tolist() for s in read_megatron(str(tmp_path / "out"))[1]] == [[0, 1, 2]] * 2


@pytest.mark.parametrize("codec, options", [("ndarray", {"dtype": "uint32"}), ("ndarray", {"dtype": "uint16", "shape": [2]}),
                                            ("bytes", {})])
def test_export_refuses_records_megatron_cannot_hold(tmp_path, codec, options):
    with varstore.Writer(tmp_path / "shard", codec, **options) as writer:
        writer.append(np.zeros((1, 2) if options.get("shape") else 2, options.get("dtype", "uint8")) if codec == "ndarray" else b"x")
    with pytest.raises(CommandError, match="Megatron dataset holds 1-D arrays"):
        export_megatron(tmp_path / "shard", tmp_path / "out")
    assert not (tmp_path / "out.idx").exists() and not (tmp_path / "out.bin").exists()


def test_export_refuses_a_compressed_shard(tmp_path):
    pytest.importorskip("zstandard")
    with varstore.Writer(tmp_path / "shard", "ndarray", dtype="uint16", compression="zstd") as writer:
        writer.append(np.arange(100, dtype=np.uint16))
    with pytest.raises(CommandError, match="is compressed"):
        export_megatron(tmp_path / "shard", tmp_path / "out")


def test_the_commands_import_and_export_and_say_the_data_is_linked(tmp_path, capsys):
    write_megatron(str(tmp_path / "corpus"), [np.arange(3, dtype=np.int16)] * 2, "int16")
    assert main(["import", "megatron", str(tmp_path / "corpus"), str(tmp_path / "dataset"), "--checksums"]) == 0
    assert "2 sequences in 2 documents; the data is a hard link" in capsys.readouterr().out
    assert main(["export", "megatron", str(tmp_path / "dataset"), str(tmp_path / "back")]) == 0
    assert (tmp_path / "back.idx").read_bytes() == (tmp_path / "corpus.idx").read_bytes()
    assert main(["import", "megatron", str(tmp_path / "corpus"), str(tmp_path / "dataset")]) == 1
    assert "exists and is not empty" in capsys.readouterr().err


@st.composite
def corpora(draw):
    dtype = draw(st.sampled_from(sorted(MEGATRON_CODES)))
    if np.dtype(dtype).kind == "f":
        elements = st.floats(width=np.dtype(dtype).itemsize * 8, allow_nan=False)
    else:
        info = np.iinfo(dtype)
        elements = st.integers(int(info.min), int(info.max))
    sequences = draw(st.lists(st.lists(elements, max_size=20), max_size=30))
    cuts = sorted(draw(st.lists(st.integers(0, len(sequences)), max_size=10)))
    return dtype, [np.array(s, dtype) for s in sequences], [0, *cuts, len(sequences)]


@given(corpora())
def test_import_then_read_and_export_give_back_the_megatron_dataset(corpus):
    dtype, sequences, document_indices = corpus
    with tempfile.TemporaryDirectory() as directory:
        write_megatron(os.path.join(directory, "corpus"), sequences, dtype, document_indices)
        import_megatron(os.path.join(directory, "corpus"), os.path.join(directory, "dataset"))
        with varstore.open(os.path.join(directory, "dataset")) as reader:
            assert [record.tobytes() for record in reader] == [sequence.tobytes() for sequence in sequences]
        export_megatron(os.path.join(directory, "dataset"), os.path.join(directory, "back"))
        found_dtype, found, found_documents = read_megatron(os.path.join(directory, "back"))
        assert (found_dtype, found_documents) == (dtype, document_indices)
        assert [s.tobytes() for s in found] == [s.tobytes() for s in sequences]

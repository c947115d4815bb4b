"""Compressed shards (spec/FORMAT.md §1.6, format 2.0; §1.7, format 3.0's blocks): the vectors and damaged cases of
spec/vectors/compressed/, the 1.1 reader's refusal of them, and varstore's writers and readers for every codec and
compression."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import varstore
from varstore.format.notation import to_json

from . import spec_reader, spec_reader_1_1
from .test_spec_damaged import _spec_refusal, _varstore_refusal

COMPRESSED = Path(__file__).resolve().parent.parent / "spec" / "vectors" / "compressed"
VECTORS = sorted(path.stem for path in COMPRESSED.glob("*.json"))
DAMAGED = sorted(path.stem for path in (COMPRESSED / "damaged").glob("*.json"))
COMPRESSIONS = ("zstd", "zstd-dict", "zstd-blocks", "zstd-dict-blocks", "auto", None)
COMPRESSION_IDS = {"zstd": 1, "zstd-dict": 2, "zstd-blocks": 3, "zstd-dict-blocks": 4}  # §1.2's byte 13


def _description(name: str) -> dict:
    return json.loads((COMPRESSED / f"{name}.json").read_text(encoding="utf-8"))


def _text(value) -> str:
    return json.dumps(value, ensure_ascii=False, allow_nan=False)


def test_vectors_cover_each_compression_and_the_cases_of_the_issue():
    assert {_description(name)["compression"] for name in VECTORS} == set(COMPRESSION_IDS)
    assert "zstd-record-larger-than-window" in VECTORS and "zstd-bytes-empty-records" in VECTORS
    assert {"dictionary-crc32c-wrong", "frame-decodes-to-more-than-declared", "frame-zstd-bomb", "frame-of-another-dictionary"} <= set(DAMAGED)
    assert {"block-checksum-wrong", "block-count-greater-than-records", "block-records-not-ending-at-n",
            "block-offsets-not-ending-at-data-size", "blocks-flag-bit-0-set", "block-records-out-of-order",
            "block-frame-content-size-differs", "blocks-compression-1", "compression-3"} <= set(DAMAGED)


def test_the_block_vectors_hold_the_blocks_section_6_lists():
    """§6: empty records, a block of empty records only and a record over the 8 KiB target alone in its block."""
    empty = _description("zstd-blocks-bytes-empty-records")
    records = [bytes.fromhex(record["$bytes"]) if isinstance(record, dict) else record.encode() for record in empty["records"]]
    bounds = np.cumsum([0, *empty["blocks"]]).tolist()
    blocks = [records[first:last] for first, last in zip(bounds, bounds[1:])]
    assert any(all(record == b"" for record in block) for block in blocks)
    assert any(len(block) == 1 and len(block[0]) > 8192 for block in blocks)
    assert len(_description("zstd-blocks-msgpack-rows")["blocks"]) > 5


@pytest.mark.parametrize("name", [name for name in VECTORS if "blocks" in name])
def test_a_block_vector_describes_the_blocks_its_index_holds(name):
    """§1.7's layout: B after the offsets, then block_offsets, then block_records, whose steps are "blocks"."""
    index = (COMPRESSED / f"{name}.index").read_bytes()
    count, metadata_size, dictionary_size = (int.from_bytes(index[at : at + width], "little") for at, width in ((16, 8), (32, 8), (52, 4)))
    offsets_start = -(-(-(-(64 + metadata_size) // 8) * 8 + dictionary_size) // 8) * 8
    blocks_start = offsets_start + 8 * (count + 1)
    block_count = int.from_bytes(index[blocks_start : blocks_start + 8], "little")
    records = np.frombuffer(index, "<u8", block_count + 1, blocks_start + 8 + 8 * (block_count + 1))
    assert np.diff(records).tolist() == _description(name)["blocks"]

@pytest.mark.parametrize("name", VECTORS)
def test_a_vector_described_as_zstd_dict_holds_a_dictionary(name):
    """A writer falls back to plain zstd when its sample is too small to train on: the vectors must not (§1.6:
    header byte 13 is the compression, bytes 52-55 the dictionary's size)."""
    index = (COMPRESSED / f"{name}.index").read_bytes()
    compression, dictionary_size = index[13], int.from_bytes(index[52:56], "little")
    described = _description(name)["compression"]
    assert (compression, dictionary_size > 0) == (COMPRESSION_IDS[described], described.startswith("zstd-dict"))


@pytest.mark.parametrize("name", VECTORS)
def test_spec_only_reader_reads_compressed_vector_back_to_its_description(name):
    expected = _description(name)
    shard = spec_reader.read_shard(str(COMPRESSED / name))
    assert shard["format_version"] == ([3, 0] if "blocks" in expected else [2, 0]) and shard["compression"] == expected["compression"]
    assert [_text(spec_reader.notation(record)) for record in shard["records"]] == [_text(record) for record in expected["records"]]


@pytest.mark.parametrize("name", VECTORS)
def test_library_reads_compressed_vector_back_to_its_description(name):
    expected = _description(name)
    with varstore.open(COMPRESSED / name) as reader:
        reader.verify()
        records = [_text(record) for record in expected["records"]]
        assert [_text(to_json(record)) for record in reader] == records
        assert [_text(to_json(record)) for record in reader.get_batch(range(len(reader))[::-1])] == records[::-1]
        assert [_text(to_json(reader[i])) for i in range(len(reader))] == records


@pytest.mark.parametrize("name", VECTORS)
def test_the_1_1_reader_refuses_every_compressed_vector_at_open(name):
    with pytest.raises(spec_reader_1_1.SpecError) as refusal:
        spec_reader_1_1.open_shard(str(COMPRESSED / name))
    assert refusal.value.rule == "§1.3 step 2"


def _case(name: str) -> dict:
    return json.loads((COMPRESSED / "damaged" / f"{name}.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize("name", DAMAGED)
def test_spec_reader_refuses_compressed_case_for_its_rule_at_its_point(name):
    case = _case(name)
    path = str(COMPRESSED / "damaged" / name / "shard")
    assert _spec_refusal(spec_reader.open_shard, path) == (case["refused_at"], case.get("record"), case["rule"])


@pytest.mark.parametrize("name", DAMAGED)
def test_varstore_refuses_compressed_case_at_its_point(name):
    case = _case(name)
    assert _varstore_refusal(str(COMPRESSED / "damaged" / name / "shard")) == (case["refused_at"], case.get("record"))


def test_a_bomb_is_refused_before_its_content_is_allocated(tmp_path):
    """The bomb's frame declares 64 MiB; the read refuses it by its header, so the reader allocates nothing near that."""
    import tracemalloc

    with varstore.open(COMPRESSED / "damaged" / "frame-zstd-bomb" / "shard") as reader:
        tracemalloc.start()
        with pytest.raises(varstore.CorruptRecordError, match="declares 67108864"):
            reader[1]
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert peak < 1 << 20


# -- varstore's writers and readers --------------------------------------------------------------------------

_TEXT = st.text(st.characters(codec="utf-8"), max_size=60)
RECORDS = {
    "bytes": (st.lists(st.binary(max_size=300), max_size=60), {}),
    "str": (st.lists(_TEXT, max_size=60), {}),
    "ndarray": (st.lists(st.lists(st.integers(0, 65535), max_size=40).map(lambda values: np.array(values, "<u2")), max_size=60), {"dtype": "<u2"}),
    "msgpack": (st.lists(st.dictionaries(st.sampled_from("abc"), st.one_of(st.integers(-5, 1 << 40), _TEXT, st.binary(max_size=20))), max_size=60), {}),
}


def _same(a, b) -> bool:
    return _text(to_json(a)) == _text(to_json(b))


@pytest.mark.parametrize("compression", COMPRESSIONS)
@pytest.mark.parametrize("codec", sorted(RECORDS))
def test_every_codec_round_trips_under_every_compression_through_both_readers(codec, compression, tmp_path_factory):
    strategy, options = RECORDS[codec]

    @settings(max_examples=25)
    @given(records=strategy, repeats=st.integers(1, 40))
    def round_trip(records, repeats):
        records = records * repeats  # repeats give the dictionary trainer a sample it can train on
        prefix = tmp_path_factory.mktemp("shard") / "s"
        with varstore.Writer(prefix, codec, compression=compression, **options) as writer:
            writer.extend(records)
        spec = spec_reader.read_shard(str(prefix))
        assert len(spec["records"]) == len(records)
        assert all(_same(got, want) for got, want in zip(spec["records"], records))
        with varstore.open(prefix) as reader:
            reader.verify()
            assert all(_same(got, want) for got, want in zip(reader, records))
            picked = list(range(len(records)))[::3]
            assert all(_same(got, records[i]) for got, i in zip(reader.get_batch(picked), picked))
            flat_sizes = [batch.values.nbytes for batch in reader.iter_flat(7)]
            assert sum(flat_sizes) == int(reader.record_sizes().sum())
            if compression is not None and reader.header.compression:
                assert reader.header.version == ((3, 0) if reader.header.compression >= 3 else (2, 0))
            else:
                assert reader.header.version[0] == 1

    round_trip()


def test_uncompressed_writer_still_writes_1_1(tmp_path):
    with varstore.Writer(tmp_path / "s", "str") as writer:
        writer.append("x")
    with varstore.open(tmp_path / "s") as reader:
        assert reader.header.version == (1, 1)


def test_auto_keeps_incompressible_records_raw_and_records_why(tmp_path):
    generator = np.random.default_rng(1)
    with varstore.Writer(tmp_path / "s", "bytes", compression="auto") as writer:
        writer.extend(generator.bytes(500) for _ in range(200))
    with varstore.open(tmp_path / "s") as reader:
        assert reader.header.version == (1, 2) and reader.header.compression == 0
        assert (tmp_path / "s.data").stat().st_size == 200 * 500
    assert spec_reader_1_1.read_shard(str(tmp_path / "s"))["record_count"] == 200  # 1.x readers ignore the member
    metadata = spec_reader.open_shard(str(tmp_path / "s")).metadata["compression"]
    assert metadata["name"] == "none" and metadata["auto"]["sample_ratios"]["zstd"] > 0.9


def test_auto_stores_small_text_records_in_blocks(tmp_path):
    """§1.7: records averaging under 2 KiB are measured in blocks too, which store these at most 0.9x frames each."""
    rows = [json.dumps({"id": i, "name": f"package-{i % 97}", "summary": "a library for reading and writing records"}) for i in range(3000)]
    with varstore.Writer(tmp_path / "s", "str", compression="auto") as writer:
        writer.extend(rows)
    with varstore.open(tmp_path / "s") as reader:
        assert reader.header.compression in (3, 4) and reader.header.version == (3, 0)
        assert list(reader) == rows
    ratios = spec_reader.open_shard(str(tmp_path / "s")).metadata["compression"]["auto"]["sample_ratios"]
    assert min(ratios["zstd-blocks"], ratios.get("zstd-dict-blocks", 1)) <= 0.9 * min(ratios["zstd"], ratios["zstd-dict"])
    assert (tmp_path / "s.data").stat().st_size < sum(map(len, rows)) / 3


def test_auto_keeps_a_frame_per_record_for_records_of_2_kib_or_more(tmp_path):
    """A random read of a block decodes all of it: records averaging 2 KiB or more are not measured in blocks."""
    rows = [" ".join(["words of a long document"] * 100) + f" number {i}" for i in range(300)]
    with varstore.Writer(tmp_path / "s", "str", compression="auto") as writer:
        writer.extend(rows)
    with varstore.open(tmp_path / "s") as reader:
        assert reader.header.compression in (1, 2)
        assert list(reader) == rows
    assert "zstd-blocks" not in spec_reader.open_shard(str(tmp_path / "s")).metadata["compression"]["auto"]["sample_ratios"]


def test_as_array_of_a_compressed_shard_is_refused_not_a_view_of_frames(tmp_path):
    with varstore.Writer(tmp_path / "s", "ndarray", dtype="<u2", compression="zstd") as writer:
        writer.append(np.arange(10, dtype="<u2"))
    with varstore.open(tmp_path / "s") as reader:
        with pytest.raises(varstore.RecordTypeError, match="compressed"):
            reader.as_array()
        assert reader.record_sizes().tolist() == [20]


def test_extend_flat_and_large_records_are_compressed_one_frame_each(tmp_path):
    big = bytes(3 << 20)  # beyond the write buffer: written at once
    with varstore.Writer(tmp_path / "s", "bytes", compression="zstd-dict") as writer:
        writer.extend_flat(b"abcdef" * 10, [6] * 10)
        writer.append(big)
    with varstore.open(tmp_path / "s") as reader:
        assert list(reader) == [b"abcdef"] * 10 + [big]
        assert reader.header.compression == 1  # 11 records are too few to train a dictionary on
    assert (tmp_path / "s.data").stat().st_size < 10_000


def test_sharded_writer_compresses_every_shard_and_the_dataset_reads_back(tmp_path):
    rows = [f"document {i} " * (i % 13) for i in range(2000)]
    with varstore.ShardedWriter(tmp_path / "d", "str", max_shard_records=700, compression="zstd") as writer:
        writer.extend(rows)
    with varstore.open(tmp_path / "d") as dataset:
        assert list(dataset) == rows
        assert dataset.get_batch([1999, 0, 701]) == [rows[1999], rows[0], rows[701]]
        dataset.verify()
    assert spec_reader.read_dataset(str(tmp_path / "d"))["shards"][2]["records"] == rows[1400:]


def test_a_compressed_shard_without_zstandard_names_the_extra(monkeypatch):
    import weakref

    from varstore.format import compression

    monkeypatch.setitem(sys.modules, "zstandard", None)
    # a decompressor another test's reader still holds would serve this shard without importing zstandard
    monkeypatch.setattr(compression, "_SHARED", weakref.WeakValueDictionary())
    with pytest.raises(varstore.VarstoreError, match=r"varstore\[zstd\]"):
        varstore.open(COMPRESSED / "zstd-str-documents")


def test_unknown_compression_and_levels_are_refused_before_writing(tmp_path):
    with pytest.raises(varstore.VarstoreError, match="compression must be"):
        varstore.Writer(tmp_path / "s", compression="gzip")
    with pytest.raises(varstore.VarstoreError, match="compression_level"):
        varstore.Writer(tmp_path / "s", compression="zstd", compression_level=22)
    assert not list(tmp_path.iterdir())

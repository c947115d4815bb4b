"""``varstore info``: what it reports of shards and datasets, from headers alone."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import varstore

from .helpers_cli import VECTOR_NAMES, VECTORS, run, run_json, write_dataset, write_shard


@pytest.mark.parametrize("name", VECTOR_NAMES)
def test_info_json_of_golden_vector_matches_its_description(capsys, name):
    expected = json.loads((VECTORS / f"{name}.json").read_text(encoding="utf-8"))
    facts = run_json(capsys, "info", VECTORS / f"{name}.index")
    for field in ("codec", "codec_params", "metadata", "record_checksums", "format_version", "record_count",
                  "data_size"):
        assert facts[field] == expected[field], field
    assert facts["data_crc32c"] == (expected["data_crc32c"] if expected.get("data_crc32c_recorded", True) else None)
    assert facts["kind"] == "shard"
    index_size = os.path.getsize(VECTORS / f"{name}.index")
    assert facts["index_size"] == index_size
    assert facts["file_size"] == index_size + os.path.getsize(VECTORS / f"{name}.data")


def test_info_of_dataset_adds_up_its_shards(capsys, tmp_path):
    records = [np.arange(size, dtype=np.int32).reshape(-1, 2) for size in (2, 4, 6, 8, 10)]
    dataset = write_dataset(tmp_path / "ds", records, codec="ndarray", dtype="int32", shape=[2], max_shard_records=2,
                            metadata={"split": "train"})
    facts = run_json(capsys, "info", dataset)
    names = sorted(name[: -len(".index")] for name in os.listdir(dataset) if name.endswith(".index"))
    assert [shard["name"] for shard in facts["shards"]] == names
    assert [shard["record_count"] for shard in facts["shards"]] == [2, 2, 1]
    assert facts["record_count"] == 5
    assert facts["data_size"] == sum(record.nbytes for record in records)
    assert facts["file_size"] == sum(os.path.getsize(dataset / name) for name in os.listdir(dataset))
    assert facts["codec_params"] == {"dtype": "<i4", "shape": [2]}
    assert facts["metadata"] == {"split": "train"}
    assert facts["record_checksums"] is True and facts["format_version"] == [1, 1]


def test_info_text_names_codec_checksums_metadata_and_shards(capsys, tmp_path):
    dataset = write_dataset(tmp_path / "ds", [np.zeros(3, np.uint16)] * 3, codec="ndarray", dtype="uint16",
                            max_shard_records=2, metadata={"tokenizer": "gpt2"})
    code, out, _ = run(capsys, "info", dataset)
    assert code == 0
    assert "ndarray: uint16, records of shape (L,)" in out
    assert "CRC32C per record and of each whole data file" in out
    assert '{"tokenizer": "gpt2"}' in out
    assert "shard-000000" in out and "shard-000001" in out
    assert "18 bytes, 6.0 bytes per record on average" in out


def test_info_says_when_records_have_no_checksums(capsys):
    code, out, _ = run(capsys, "info", VECTORS / "bytes-without-checksums")
    assert code == 0
    assert "no per-record checksums; CRC32C of the whole data file only" in out


def test_info_on_mixed_shards_reports_each(capsys, tmp_path):
    write_shard(tmp_path / "a", [b"x"], checksums=True)
    write_shard(tmp_path / "b", [b"y"], checksums=False)
    varstore.write_manifest(tmp_path)
    facts = run_json(capsys, "info", tmp_path)
    assert facts["record_checksums"] is None
    assert [shard["record_checksums"] for shard in facts["shards"]] == [True, False]
    code, out, _ = run(capsys, "info", tmp_path)
    assert "CRC32C per record in 1 of 2 shards" in out


def test_info_never_reads_record_sizes_or_records(capsys, tmp_path, monkeypatch):
    dataset = write_dataset(tmp_path / "ds", [b"abc"] * 10, max_shard_records=3)
    for reader_class in (varstore.Reader, varstore.ShardedReader):
        for method in ("record_sizes", "__iter__", "get_batch", "verify"):
            monkeypatch.setattr(reader_class, method, lambda *args, **kwargs: pytest.fail("info read records"))
    assert run_json(capsys, "info", dataset)["record_count"] == 10
    assert run_json(capsys, "info", dataset / "shard-000003")["record_count"] == 1

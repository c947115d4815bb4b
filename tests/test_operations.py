"""The dataset operations as Python calls (``varstore.copy``, ``merge``, ``repair``, ``describe``, ``verify``; the
command line is a face over them): each does the work and returns a result object that says what it did."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

import varstore
from varstore.errors import CommandError, UsageError
from varstore.format.manifest import MANIFEST_NAME
from varstore.local.publish import TEMP_MARK
from varstore.operations.statistics import statistics

from .helpers_cli import flip_byte, write_dataset

RECORD_BYTES = 3000  # record 2 of a five-record shard lies clear of the first and last 4 KiB, which opening checks


def _records(path: Path | str, **options: Any) -> list[Any]:
    with varstore.open(path, **options) as reader:
        return list(reader)


class _Recorder:
    """A progress bar that records the total and unit it was given and every amount reported."""

    def __init__(self) -> None:
        self.totals: list[int] = []
        self.units: list[str] = []
        self.amounts: list[int] = []

    @contextlib.contextmanager
    def __call__(self, total: int, unit: str) -> Iterator[Any]:
        self.totals.append(total)
        self.units.append(unit)
        yield self.amounts.append


@pytest.fixture
def payloads() -> list[bytes]:
    """Twenty records of 3,000 bytes (record i is byte i repeated)."""
    return [bytes([index]) * RECORD_BYTES for index in range(20)]


@pytest.mark.timeout(120)
def test_copy_brings_every_record_and_the_manifest_byte_for_byte(tmp_path, payloads):
    source = write_dataset(tmp_path / "src", payloads, max_shard_records=6, metadata={"kind": "test"})
    progress = _Recorder()
    result = varstore.copy(source, tmp_path / "nested" / "dst", progress=progress)
    assert (result.kind, result.records, result.shards, result.verified) == ("dataset", 20, 4, True)
    assert _records(tmp_path / "nested" / "dst") == payloads
    assert (tmp_path / "nested" / "dst" / MANIFEST_NAME).read_bytes() == (source / MANIFEST_NAME).read_bytes()
    files = sum(os.path.getsize(source / name) for name in os.listdir(source) if name.endswith((".data", ".index")))
    assert result.size == files and progress.totals == [files] and sum(progress.amounts) == files
    assert progress.units == ["B"]


@pytest.mark.timeout(120)
def test_copy_refuses_what_is_there_unless_overwrite_and_copies_a_lone_shard(tmp_path, payloads):
    source = write_dataset(tmp_path / "src", payloads[:4])
    varstore.copy(source, tmp_path / "dst")
    with pytest.raises(CommandError, match="already there"):
        varstore.copy(source, tmp_path / "dst")
    with pytest.raises(UsageError, match="the same place"):
        varstore.copy(source, source)
    assert varstore.copy(source, tmp_path / "dst", overwrite=True).records == 4
    with varstore.Writer(tmp_path / "lone", codec="str") as writer:
        writer.extend(["a", "bc"])
    result = varstore.copy(tmp_path / "lone.index", tmp_path / "copied")
    assert (result.kind, result.records, result.shards) == ("shard", 2, 1)
    assert _records(tmp_path / "copied") == ["a", "bc"]


@pytest.mark.timeout(120)
def test_copy_to_object_storage_and_back(tmp_path, s3_server, payloads):
    pytest.importorskip("s3fs")
    source = write_dataset(tmp_path / "src", payloads[:11], max_shard_records=4)
    url = f"s3://{s3_server.new_bucket()}/ds"
    options = {"storage_options": s3_server.storage_options, "cache_dir": str(tmp_path / "cache")}
    assert varstore.copy(source, url, **options).shards == 3
    assert _records(url, **options) == payloads[:11]
    assert varstore.copy(url, tmp_path / "back", **options).records == 11
    assert _records(tmp_path / "back") == payloads[:11]


@pytest.mark.timeout(120)
def test_merge_keeps_every_record_in_the_order_given(tmp_path):
    first = write_dataset(tmp_path / "a", [f"a{index}" for index in range(7)], codec="str", max_shard_records=3)
    second = write_dataset(tmp_path / "b", [f"b{index}" for index in range(4)], codec="str", max_shard_records=3)
    result = varstore.merge([second, first], tmp_path / "merged")
    assert _records(tmp_path / "merged") == [f"b{index}" for index in range(4)] + [f"a{index}" for index in range(7)]
    assert (result.sources, result.shards, result.records, result.files) == (2, 5, 11, 10)
    assert result.linked == 10 and not result.uploaded and not result.metadata_differ
    assert _records(first) == [f"a{index}" for index in range(7)]  # the sources are left as they were


@pytest.mark.timeout(120)
def test_merge_drops_differing_metadata_and_refuses_other_codecs_and_a_shard_twice(tmp_path):
    first = write_dataset(tmp_path / "a", ["x"], codec="str", metadata={"from": "a"})
    second = write_dataset(tmp_path / "b", ["y"], codec="str", metadata={"from": "b"})
    result = varstore.merge([first, second], tmp_path / "merged", copy=True)
    assert result.metadata_differ and result.metadata == {} and result.linked == 0
    assert varstore.open(tmp_path / "merged").metadata == {}
    given = varstore.merge([first, second], tmp_path / "given", metadata={"set": 1})
    assert not given.metadata_differ and varstore.open(tmp_path / "given").metadata == {"set": 1}
    other = write_dataset(tmp_path / "c", [b"z"], codec="bytes")
    with pytest.raises(CommandError, match="cannot merge different codecs"):
        varstore.merge([first, other], tmp_path / "mixed")
    with pytest.raises(UsageError, match="given twice"):
        varstore.merge([first, first], tmp_path / "twice")
    assert not (tmp_path / "mixed").exists() and not (tmp_path / "twice").exists()


@pytest.fixture
def damaged(tmp_path, payloads) -> Path:
    """Four shards of five records; shard 1's record 2 (dataset record 7) has a flipped byte."""
    directory = write_dataset(tmp_path / "ds", payloads, max_shard_records=5)
    flip_byte(directory / "shard-000001.data", 2 * RECORD_BYTES + 7)
    return directory


@pytest.mark.timeout(120)
def test_repair_drops_the_damaged_shard_and_keeps_the_rest(damaged, payloads):
    manifest = (damaged / MANIFEST_NAME).read_bytes()
    report = varstore.repair(damaged)
    assert [shard.name for shard in report.damaged] == ["shard-000001"] and not report.written
    assert "checksum" in report.damaged[0].reason and report.dropped_records == 5
    assert report.kept == ["shard-000000", "shard-000002", "shard-000003"] and report.kept_records == 15
    assert (damaged / MANIFEST_NAME).read_bytes() == manifest  # without write nothing changes
    written = varstore.repair(damaged / MANIFEST_NAME, write=True)
    assert written.written and written.kept == report.kept
    assert _records(damaged) == payloads[:5] + payloads[10:]
    assert (damaged / "shard-000001.data").exists()  # left in place for salvage
    again = varstore.repair(damaged)
    assert again.ok and again.kept_records == 15


@pytest.mark.timeout(120)
def test_repair_refuses_what_is_not_a_dataset(tmp_path):
    with pytest.raises(UsageError, match="is not a dataset directory"):
        varstore.repair(tmp_path / "nothing")


@pytest.mark.timeout(120)
def test_describe_counts_a_token_dataset_from_its_headers(tmp_path):
    documents = [np.arange(length, dtype=np.uint16) for length in (3, 0, 5, 8, 1)]
    directory = write_dataset(tmp_path / "tokens", documents, codec="ndarray", dtype="uint16", max_shard_records=2,
                               metadata={"tokenizer": "gpt2"})
    facts = varstore.describe(directory)
    assert (facts.kind, facts.record_count, len(facts.shards), facts.files) == ("dataset", 5, 3, (MANIFEST_NAME,))
    assert (facts.codec, facts.codec_params) == ("ndarray", {"dtype": "<u2", "shape": []})
    assert (facts.length_unit, facts.rows, facts.elements) == ("tokens", 17, 17)
    assert facts.data_size == 34 and [shard.record_count for shard in facts.shards] == [2, 2, 1]
    assert facts.record_checksums is True and facts.metadata == {"tokenizer": "gpt2"}
    on_disk = sum(os.path.getsize(directory / name) for name in os.listdir(directory) if not name.endswith(".lock"))
    assert facts.file_size == on_disk
    shard = varstore.describe(directory / "shard-000002")
    assert (shard.kind, shard.record_count, shard.rows, shard.files) == ("shard", 1, 1, ("shard-000002.index", "shard-000002.data"))
    assert shard.as_json()["data_crc32c"] == shard.data_crc32c is not None


@pytest.mark.timeout(120)
def test_verify_reports_the_damaged_record_of_a_planted_byte_flip(damaged):
    progress = _Recorder()
    report = varstore.verify(damaged, progress=progress)
    assert not report.ok and report.is_dataset and report.records == 20
    assert [check.name for check in report.bad_shards] == ["shard-000001"]
    assert report.bad_shards[0].bad_records == [2] and report.bad_records == [7]
    assert "dataset record 7" in report.damage()
    assert report.checked_bytes == 20 * RECORD_BYTES == progress.totals[0] == sum(progress.amounts)


@pytest.mark.timeout(120)
def test_verify_of_an_intact_store_and_its_temporary_files(tmp_path, payloads):
    directory = write_dataset(tmp_path / "ds", payloads[:3])
    leftover = directory / f"shard-000009.data{TEMP_MARK}0123456789ab"
    leftover.write_bytes(b"")
    report = varstore.verify(directory)
    assert report.ok and report.damage() is None and report.records == 3
    assert report.temporary_files == [str(leftover)] and not report.writer_running
    cleaned = varstore.verify(directory, remove_temporary=True)
    assert cleaned.removed_temporary_files == [str(leftover)] and cleaned.temporary_files == []
    assert not leftover.exists()


@pytest.mark.timeout(120)
def test_statistics_of_record_sizes(tmp_path):
    directory = write_dataset(tmp_path / "ds", [b"x" * size for size in (1, 2, 3, 10, 100)])
    figures = statistics(directory)
    assert (figures.records, figures.total_bytes, figures.min, figures.max) == (5, 116, 1, 100)
    assert figures.percentiles["p50"] == 3 and sum(row["count"] for row in figures.histogram) == 5
    assert figures.lengths is None

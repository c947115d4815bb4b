"""Verifying a dataset's shards several at once (`verify(workers=N)`, `ShardedReader.verify(workers=N)`,
``varstore verify --workers N``) finds exactly what one at a time finds, reports the same progress, really runs
shards side by side, and refuses a worker count below 1."""

from __future__ import annotations

import os
import threading

import pytest

import varstore
import varstore.shard.reader as reader_module
from varstore.errors import CorruptRecordError, FormatError, UsageError
from varstore.operations.verify import verify

from .helpers_cli import flip_byte, run, write_dataset

RECORD_BYTES = 3000  # record 2 of a five-record shard lies clear of the first and last 4 KiB, which opening checks
SHARDS = 6


@pytest.fixture
def dataset(tmp_path):
    """Six shards of five 3000-byte records each; record i is filled with byte i."""
    return write_dataset(tmp_path / "ds", [bytes([index]) * RECORD_BYTES for index in range(5 * SHARDS)], max_shard_records=5)


def plant_damage(dataset) -> None:
    """Shard 1: record 2's bytes; shard 3: the index body; shard 4: records 1 and 3; shard 5: its data file cut short."""
    flip_byte(dataset / "shard-000001.data", 2 * RECORD_BYTES + 10)
    flip_byte(dataset / "shard-000003.index", os.path.getsize(dataset / "shard-000003.index") - 1)
    flip_byte(dataset / "shard-000004.data", 1 * RECORD_BYTES + 1500)
    flip_byte(dataset / "shard-000004.data", 3 * RECORD_BYTES + 500)
    with open(dataset / "shard-000005.data", "r+b") as file:
        file.truncate(RECORD_BYTES)


def outcomes(report) -> list[tuple[str, int, str | None, list[int]]]:
    return [(check.name, check.first_record, check.error, check.bad_records) for check in report.shards]


@pytest.mark.parametrize("workers", [2, 3, SHARDS + 2])
def test_every_planted_damage_is_found_by_several_workers_as_by_one(dataset, workers):
    plant_damage(dataset)
    together, alone = verify(dataset, workers=workers), verify(dataset)
    assert outcomes(together) == outcomes(alone)
    assert [check.name for check in together.bad_shards] == ["shard-000001", "shard-000003", "shard-000004", "shard-000005"]
    assert together.bad_records == [5 + 2, 20 + 1, 20 + 3]
    assert together.shards[0].ok and together.shards[2].ok


def test_progress_with_workers_counts_every_byte_once(dataset):
    amounts: list[int] = []
    verify(dataset, workers=3, progress=lambda total, unit: _recording(amounts))
    assert sum(amounts) == 5 * SHARDS * RECORD_BYTES


class _recording:
    def __init__(self, amounts: list[int]) -> None:
        self.amounts = amounts

    def __enter__(self):
        return self.amounts.append

    def __exit__(self, *exc):
        return None


def test_workers_verify_shards_at_the_same_time(dataset, monkeypatch):
    """Two shards' checks must meet at a barrier: one at a time, the first would wait there for a second that never
    comes (and the barrier's timeout, a safety net, breaks it)."""
    barrier = threading.Barrier(2, timeout=60)
    real_verify = reader_module.Reader.verify

    def verify_at_the_barrier(self, progress=None):
        barrier.wait()
        return real_verify(self, progress)

    monkeypatch.setattr(reader_module.Reader, "verify", verify_at_the_barrier)
    with varstore.open(dataset) as reader:
        reader.verify(workers=2)
    barrier.reset()
    assert verify(dataset, workers=2).ok


def test_sharded_reader_verify_with_workers_raises_the_first_damaged_shard_in_order(dataset):
    flip_byte(dataset / "shard-000004.data", 2 * RECORD_BYTES + 10)
    flip_byte(dataset / "shard-000002.data", 1 * RECORD_BYTES + 1500)
    with varstore.open(dataset) as reader:
        with pytest.raises(CorruptRecordError) as together:
            reader.verify(workers=4)
        with pytest.raises(CorruptRecordError) as alone:
            reader.verify()
    assert str(together.value) == str(alone.value)
    assert together.value.records == [1] and "shard-000002" in str(together.value)


def test_sharded_reader_verify_with_workers_raises_a_damaged_index_as_one_worker_does(dataset):
    flip_byte(dataset / "shard-000003.index", os.path.getsize(dataset / "shard-000003.index") - 1)
    with varstore.open(dataset) as reader:
        with pytest.raises(FormatError) as together:
            reader.verify(workers=3)
        with pytest.raises(FormatError) as alone:
            reader.verify()
    assert str(together.value) == str(alone.value)


@pytest.mark.parametrize("workers", [0, -1, 1.5, True, "2", None])
def test_a_worker_count_below_one_or_not_an_int_is_refused(dataset, workers):
    with pytest.raises(UsageError, match="workers must be a positive integer"):
        verify(dataset, workers=workers)
    with varstore.open(dataset) as reader, pytest.raises(UsageError, match="workers must be a positive integer"):
        reader.verify(workers=workers)


def test_cli_workers_lists_the_same_damage_as_one_worker(capsys, dataset):
    plant_damage(dataset)
    code_together, out_together, _ = run(capsys, "verify", "--workers", "3", dataset)
    code_alone, out_alone, _ = run(capsys, "verify", dataset)
    assert code_together == code_alone == 1
    assert out_together.splitlines()[:4] == out_alone.splitlines()[:4]
    summary = "FAILED: 4 of 6 shards damaged (shard-000001, shard-000003, shard-000004, shard-000005); "
    assert out_together.splitlines()[4].startswith(summary) and out_alone.splitlines()[4].startswith(summary)


def test_cli_workers_on_an_intact_dataset_reports_ok(capsys, dataset):
    code, out, _ = run(capsys, "verify", "--workers", "4", dataset)
    assert code == 0 and out.startswith(f"ok: {5 * SHARDS} records in {SHARDS} shards; ")


@pytest.mark.parametrize("value", ["0", "-2", "two"])
def test_cli_workers_below_one_is_a_usage_error(capsys, dataset, value):
    code, out, err = run(capsys, "verify", "--workers", value, dataset)
    assert code == 2 and out == ""
    assert "--workers" in err


def test_cli_workers_on_s3_lists_every_damaged_shard_as_one_worker_does(capsys, tmp_path, monkeypatch, s3_server):
    """At a URL each worker downloads its shard into the node cache (one of this test's own), then checks it."""
    pytest.importorskip("s3fs")
    monkeypatch.setenv("VARSTORE_CACHE_DIR", str(tmp_path / "cache"))
    from varstore.remote.filesystems import open_filesystem

    from .helpers_cli import run_json
    from .test_cli_remote import _options, _upload

    local = write_dataset(tmp_path / "local", [bytes([index]) * RECORD_BYTES for index in range(5 * SHARDS)], max_shard_records=5)
    url = _upload(local, f"s3://{s3_server.new_bucket()}/ds", s3_server)
    fs, root = open_filesystem(url, s3_server.storage_options)
    for name in ("shard-000001.data", "shard-000004.data"):
        data = bytearray(fs.cat_file(f"{root}/{name}"))
        data[2 * RECORD_BYTES + 10] ^= 0x01
        fs.pipe_file(f"{root}/{name}", bytes(data))
    together = run_json(capsys, "verify", url, "--workers", "3", "--storage-options", _options(s3_server), expected_code=1)
    alone = run_json(capsys, "verify", url, "--storage-options", _options(s3_server), expected_code=1)
    assert together["shards"] == alone["shards"]
    assert [shard["ok"] for shard in together["shards"]] == [True, False, True, True, False, True]

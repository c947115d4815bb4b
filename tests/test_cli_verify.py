"""``varstore verify``: intact stores pass; every damaged shard and record is listed and the exit code is 1."""

from __future__ import annotations

import os

import numpy as np
import pytest

import varstore
from varstore.format.manifest import MANIFEST_NAME
from varstore.local.publish import TEMP_MARK

from .helpers_cli import VECTOR_NAMES, VECTORS, assert_one_line_error, flip_byte, run, run_json, run_script, write_dataset

RECORD_BYTES = 3000  # so record 2 of a five-record shard lies clear of the first and last 4 KiB, which opening checks


@pytest.fixture
def dataset(tmp_path):
    """Four shards of five 3000-byte records each; record i is filled with byte i."""
    return write_dataset(tmp_path / "ds", [bytes([index]) * RECORD_BYTES for index in range(20)], max_shard_records=5)


def _verify(capsys, *args):
    code, out, err = run(capsys, "verify", *args)
    assert err == ""
    return code, out


@pytest.mark.parametrize("name", VECTOR_NAMES)
def test_golden_vectors_verify(capsys, name):
    code, out = _verify(capsys, VECTORS / name)
    assert code == 0 and out.startswith("ok: ")


def test_intact_dataset_passes_and_reports_what_it_checked(capsys, dataset):
    code, out = _verify(capsys, dataset)
    assert code == 0
    assert out.startswith("ok: 20 records in 4 shards; 58.6 KiB of records checked in ")
    report = run_json(capsys, "verify", dataset)
    assert report["ok"] is True
    assert report["checked_bytes"] == 20 * RECORD_BYTES
    assert [shard["name"] for shard in report["shards"]] == [f"shard-{index:06d}" for index in range(4)]
    assert report["bytes_per_second"] > 0


def test_flipped_payload_bytes_are_listed_by_shard_and_dataset_record(capsys, dataset):
    flip_byte(dataset / "shard-000001.data", 2 * RECORD_BYTES + 10)  # shard 1, record 2: dataset record 7
    flip_byte(dataset / "shard-000002.data", 2 * RECORD_BYTES + 99)  # shard 2, record 2: dataset record 12
    code, out = _verify(capsys, dataset)
    assert code == 1
    lines = out.splitlines()
    assert lines[0].startswith("FAILED shard-000001: ") and lines[0].endswith(": 2 (dataset record 7)")
    assert lines[1].startswith("FAILED shard-000002: ") and lines[1].endswith(": 2 (dataset record 12)")
    assert lines[2].startswith("FAILED: 2 of 4 shards damaged (shard-000001, shard-000002); ")
    report = run_json(capsys, "verify", dataset, expected_code=1)
    assert report["ok"] is False
    bad = {shard["name"]: (shard["first_record"], shard["bad_records"]) for shard in report["shards"] if not shard["ok"]}
    assert bad == {"shard-000001": (5, [2]), "shard-000002": (10, [2])}


def test_every_kind_of_damage_is_listed_in_one_run(capsys, dataset):
    (dataset / "shard-000000.index").unlink()
    with open(dataset / "shard-000001.data", "r+b") as file:
        file.truncate(RECORD_BYTES)
    flip_byte(dataset / "shard-000002.index", os.path.getsize(dataset / "shard-000002.index") - 1)
    flip_byte(dataset / "shard-000003.data", 2 * RECORD_BYTES)
    code, out = _verify(capsys, dataset)
    assert code == 1
    lines = out.splitlines()
    assert [line.split(":")[0] for line in lines[:4]] == [f"FAILED shard-{index:06d}" for index in range(4)]
    assert "missing" in lines[0]
    assert f"shard file is {RECORD_BYTES} bytes, the manifest says {5 * RECORD_BYTES}" in lines[1]
    assert "checksum" in lines[2]
    assert lines[3].endswith(": 2 (dataset record 17)")
    assert lines[4].startswith("FAILED: 4 of 4 shards damaged")


def test_damaged_single_shard_exits_1_from_the_console_script(dataset):
    flip_byte(dataset / "shard-000003.data", 2 * RECORD_BYTES + 1)
    result = run_script("verify", dataset / "shard-000003.index")
    assert result.returncode == 1
    assert result.stdout.decode().startswith("FAILED: ")
    assert "1 record fails its checksum: 2" in result.stdout.decode()


def test_truncated_shard_is_one_line_error(capsys, dataset):
    with open(dataset / "shard-000000.data", "r+b") as file:
        file.truncate(10)
    code, _, err = run(capsys, "verify", dataset / "shard-000000")
    assert_one_line_error(code, err, "shard-000000.data", "10 bytes")


def test_shard_without_record_checksums_is_checked_by_its_data_checksum(capsys, tmp_path):
    with varstore.Writer(tmp_path / "plain", checksums=False) as writer:
        writer.extend([bytes(RECORD_BYTES)] * 4)
    assert _verify(capsys, tmp_path / "plain")[0] == 0
    flip_byte(tmp_path / "plain.data", 2 * RECORD_BYTES)
    code, out = _verify(capsys, tmp_path / "plain")
    assert code == 1 and "data checksum" in out


def test_damaged_manifest_is_one_line_error(capsys, dataset):
    (dataset / MANIFEST_NAME).write_text("{not json")
    code, _, err = run(capsys, "verify", dataset)
    assert_one_line_error(code, err, MANIFEST_NAME, "not valid UTF-8 JSON")


def test_temporary_files_are_reported_and_removed_on_request(capsys, dataset):
    leftover = dataset / f"shard-000004.data{TEMP_MARK}0123456789ab"
    leftover.write_bytes(b"half a shard")
    code, out = _verify(capsys, dataset)
    assert code == 0 and "note: 1 temporary files left by interrupted writers" in out
    report = run_json(capsys, "verify", dataset, "--remove-temporary")
    assert report["removed_temporary_files"] == [str(leftover)]
    assert report["temporary_files"] == []
    assert not leftover.exists()


def test_ndarray_dataset_with_bad_offsets_fails(capsys, tmp_path):
    dataset = write_dataset(tmp_path / "ds", [np.arange(2000, dtype=np.int64)] * 3, codec="ndarray", dtype="int64")
    index = dataset / "shard-000000.index"
    with varstore.open(dataset / "shard-000000") as reader:
        second_offset = reader.header.offsets_start + 8
    flip_byte(index, second_offset + 2)
    code, out = _verify(capsys, dataset)
    assert code == 1 and out.startswith("FAILED shard-000000: ")

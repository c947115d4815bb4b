"""``varstore repair``: lists the shards that fail verification; only ``--write`` commits a manifest without them,
under the dataset's writer lock, saying exactly which shards and how many records it dropped."""

from __future__ import annotations

import os

import pytest

import varstore
from varstore.local.locks import lock_directory
from varstore.format.manifest import MANIFEST_NAME

from .helpers_cli import assert_one_line_error, flip_byte, run, write_dataset

RECORD_BYTES = 3000  # record 2 of a five-record shard lies clear of the first and last 4 KiB, which opening checks


@pytest.fixture
def damaged(tmp_path):
    """Four shards of five records (record i is byte i); shard 1 has a flipped payload byte, shard 3 no index."""
    directory = write_dataset(tmp_path / "ds", [bytes([index]) * RECORD_BYTES for index in range(20)], max_shard_records=5)
    flip_byte(directory / "shard-000001.data", 2 * RECORD_BYTES + 7)
    os.remove(directory / "shard-000003.index")
    return directory


def test_without_write_lists_what_it_would_drop_changes_nothing_and_exits_1(capsys, damaged):
    manifest = (damaged / MANIFEST_NAME).read_bytes()
    code, out, err = run(capsys, "repair", damaged)
    assert (code, err) == (1, "")
    lines = out.splitlines()
    assert lines[0].startswith("would drop shard-000001 (5 records): ") and "1 record fails its checksum" in lines[0]
    assert lines[1].startswith("would drop shard-000003 (5 records): ") and "missing" in lines[1]
    assert lines[2] == ("would drop 2 damaged shards (shard-000001, shard-000003), 10 records; "
                        "run again with --write to commit a manifest without them")
    assert (damaged / MANIFEST_NAME).read_bytes() == manifest


def test_write_commits_a_manifest_of_the_shards_that_verify(capsys, damaged):
    code, out, err = run(capsys, "repair", damaged, "--write")
    assert (code, err) == (0, "")
    assert out.splitlines()[-1] == (
        "dropped 2 damaged shards (shard-000001, shard-000003), 10 records; the manifest now lists 2 shards "
        "and 10 records; the dropped shards' files are left in place"
    )
    repaired = varstore.open(damaged)
    repaired.verify()
    assert list(repaired) == [bytes([index]) * RECORD_BYTES for index in (*range(5), *range(10, 15))]
    assert run(capsys, "repair", damaged)[:2] == (0, "ok: all 2 shards verify; nothing to drop\n")


def test_write_is_refused_while_a_writer_holds_the_dataset(capsys, damaged):
    manifest = (damaged / MANIFEST_NAME).read_bytes()
    with lock_directory(str(damaged)):
        code, _, err = run(capsys, "repair", damaged, "--write")
    assert_one_line_error(code, err, "varstore repair: ", "another writer")
    assert code == 1 and (damaged / MANIFEST_NAME).read_bytes() == manifest


def test_a_shard_or_unreadable_manifest_is_a_one_line_error(capsys, tmp_path, damaged):
    code, _, err = run(capsys, "repair", damaged / "shard-000000")
    assert_one_line_error(code, err, "is not a dataset directory")
    assert code == 2
    (damaged / MANIFEST_NAME).write_text("{")
    code, _, err = run(capsys, "repair", damaged)
    assert_one_line_error(code, err, "manifest is not valid")
    assert code == 1


def test_an_os_error_while_checking_a_shard_aborts_the_repair_instead_of_dropping_the_shard(capsys, damaged, monkeypatch):
    """Running out of file descriptors (or an I/O error) says nothing about a shard: it must not be dropped."""
    manifest = (damaged / MANIFEST_NAME).read_bytes()

    def out_of_descriptors(*args, **options):
        raise varstore.StorageError("cannot open: Too many open files", path=str(args[0]))

    monkeypatch.setattr("varstore.operations.repair.open_listed_shard", out_of_descriptors)
    code, out, err = run(capsys, "repair", damaged, "--write")
    assert code == 1 and out == ""
    assert_one_line_error(code, err, "varstore repair", "Too many open files")
    assert (damaged / MANIFEST_NAME).read_bytes() == manifest

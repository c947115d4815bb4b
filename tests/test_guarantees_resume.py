"""docs/guarantees.md, "Resume continues only its own run": what no other test reached — a manifest committed or
removed behind the journal's back, a shard of another codec under a name the run began, a committed shard replaced
by a valid one or damaged past its edges, and the files of a discarded last shard."""

from __future__ import annotations

import os

import pytest

import varstore
from varstore.format.manifest import MANIFEST_NAME

from .helpers_reliability import assert_store_holds, final_index_names
from .test_resume import RECORDS, interrupted_dataset, killed_run, resume


def test_resume_is_refused_when_a_manifest_was_committed_behind_the_journals_back(tmp_path):
    killed_run(tmp_path, RECORDS[:23], max_shard_records=10)
    varstore.write_manifest(tmp_path)  # lists the two shards the run committed; the run's journal stays
    with pytest.raises(varstore.ShardExistsError, match="a dataset is already committed here"):
        varstore.ShardedWriter(tmp_path, resume=True, max_shard_records=10)
    assert_store_holds(tmp_path, RECORDS[:20])


def test_resume_of_an_overwrite_is_refused_once_the_manifest_it_was_replacing_is_gone(tmp_path):
    with varstore.ShardedWriter(tmp_path, max_shard_records=10) as writer:
        writer.extend(RECORDS[:5])
    killed_run(tmp_path, RECORDS[:23], max_shard_records=10, overwrite=True)
    os.unlink(tmp_path / MANIFEST_NAME)
    with pytest.raises(varstore.ShardExistsError, match="the manifest the interrupted run was replacing is gone"):
        varstore.ShardedWriter(tmp_path, resume=True, max_shard_records=10)
    assert not (tmp_path / MANIFEST_NAME).exists()


def test_resume_refuses_a_shard_of_another_codec_under_the_name_the_run_began(tmp_path):
    interrupted_dataset(tmp_path, 2)  # shards 0 and 1 committed, shard 2 begun and lost with the process
    with varstore.Writer(tmp_path / "shard-000002", codec="msgpack") as writer:
        writer.append({"not": "this run's"})
    with pytest.raises(varstore.RecordTypeError, match="shard-000002.*stores codec msgpack"):
        varstore.ShardedWriter(tmp_path, resume=True, max_shard_records=10)
    assert final_index_names(tmp_path) == ["shard-000000", "shard-000001", "shard-000002"]
    assert not (tmp_path / MANIFEST_NAME).exists()


def test_resume_refuses_a_committed_shard_replaced_by_a_valid_one_the_journal_does_not_describe(tmp_path):
    interrupted_dataset(tmp_path, 3)
    with varstore.Writer(tmp_path / "shard-000001", overwrite=True) as writer:
        writer.extend([b"another run's record"] * 10)  # as many records, whole and valid: only the journal tells
    with pytest.raises(varstore.FormatError, match="shard-000001.*differs from the one the interrupted run committed"):
        varstore.ShardedWriter(tmp_path, resume=True, max_shard_records=10)
    assert final_index_names(tmp_path) == ["shard-000000", "shard-000001", "shard-000002"]


def test_resume_reads_each_adopted_shard_whole_and_refuses_one_damaged_past_its_edges(tmp_path):
    records = [bytes([number]) * 3000 for number in range(30)]
    killed_run(tmp_path, records[:25], max_shard_records=10)  # shards 0 and 1 committed, 30,000 data bytes each
    with open(tmp_path / "shard-000000.data", "r+b") as file:
        file.seek(15_000)  # far from the first and last 4 KiB, which opening a shard checks
        file.write(b"\xff")
    with pytest.raises(varstore.FormatError, match="shard-000000"):
        varstore.ShardedWriter(tmp_path, resume=True, max_shard_records=10)


def test_resume_removes_the_files_of_the_damaged_last_shard_it_discards(tmp_path):
    interrupted_dataset(tmp_path, 2, last_committed=True)  # shard 2 committed just before the kill, not journaled
    with open(tmp_path / "shard-000002.data", "r+b") as file:
        file.write(b"\xff\xff\xff")
    assert resume(tmp_path) == 20
    assert_store_holds(tmp_path, RECORDS)
    shards = [f"shard-{number:06d}{suffix}" for number in range(4) for suffix in (".data", ".index")]
    assert sorted(os.listdir(tmp_path)) == sorted([MANIFEST_NAME, *shards]), "no file of the discarded shard is left"

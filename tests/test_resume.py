"""ShardedWriter(resume=True): what it adopts, what it discards, and what it refuses."""

from __future__ import annotations

import os

import pytest

import varstore
from varstore.format.manifest import MANIFEST_NAME

from .helpers_reliability import assert_store_holds, final_index_names, make_records

RECORDS = make_records(50, 40)


def interrupted_dataset(directory, shards: int, *, last_committed: bool = False, **options) -> None:
    """Shards as a writer leaves them when it dies before its manifest: committed, unlisted.

    With `last_committed` the writer dies just after committing its last shard, before its journal says so.
    """
    options.setdefault("max_shard_records", 10)
    writer = varstore.ShardedWriter(directory, **options)
    writer.extend(RECORDS[: 10 * shards + 3])
    if last_committed:
        writer._writer.close()
    else:
        writer._writer.abort()  # the shard in progress dies with the process
    writer._writer = None
    writer._closed = True
    del writer  # the process ends: its locks go


def resume(directory, **options) -> int:
    options.setdefault("max_shard_records", 10)
    with varstore.ShardedWriter(directory, resume=True, **options) as writer:
        done = len(writer)
        writer.extend(RECORDS[done:])
    return done


def test_resume_adopts_committed_shards_and_finishes_the_dataset(tmp_path):
    interrupted_dataset(tmp_path, 2)
    (tmp_path / "shard-000002.data.varstore-tmp-abcdef").write_bytes(b"left by the dead writer")
    assert resume(tmp_path) == 20
    assert_store_holds(tmp_path, RECORDS)
    assert final_index_names(tmp_path) == [f"shard-{number:06d}" for number in range(4)]
    assert sorted(os.listdir(tmp_path)) == sorted([MANIFEST_NAME] + [f"shard-{n:06d}{s}" for n in range(4) for s in (".data", ".index")])


def test_resume_with_nothing_to_adopt_starts_from_the_beginning(tmp_path):
    assert resume(tmp_path / "new") == 0
    assert_store_holds(tmp_path / "new", RECORDS)


def test_resume_adopts_a_last_shard_committed_just_before_the_kill(tmp_path):
    interrupted_dataset(tmp_path, 2, last_committed=True)
    assert resume(tmp_path) == 23
    assert_store_holds(tmp_path, RECORDS)


def test_resume_discards_a_damaged_last_shard(tmp_path):
    interrupted_dataset(tmp_path, 2, last_committed=True)
    with open(tmp_path / "shard-000002.data", "r+b") as file:
        file.seek(1)
        file.write(b"\x00\x01\x02")
    assert resume(tmp_path) == 20
    assert_store_holds(tmp_path, RECORDS)


def test_resume_discards_a_half_published_last_shard(tmp_path):
    interrupted_dataset(tmp_path, 2, last_committed=True)
    os.unlink(tmp_path / "shard-000002.index")  # killed between the data and the index link
    assert resume(tmp_path) == 20
    assert_store_holds(tmp_path, RECORDS)


def test_resume_refuses_a_journaled_shard_that_changed(tmp_path):
    interrupted_dataset(tmp_path, 3)
    with open(tmp_path / "shard-000002.data", "r+b") as file:
        file.seek(1)
        file.write(b"\x00\x01\x02")
    with pytest.raises(varstore.FormatError, match="shard-000002"):
        varstore.ShardedWriter(tmp_path, resume=True, max_shard_records=10)


def test_resume_refuses_a_damaged_shard_before_the_last(tmp_path):
    interrupted_dataset(tmp_path, 3)
    os.truncate(tmp_path / "shard-000000.data", 3)
    with pytest.raises(varstore.FormatError, match="shard-000000"):
        varstore.ShardedWriter(tmp_path, resume=True, max_shard_records=10)
    assert (tmp_path / "shard-000002.index").exists(), "nothing is discarded when resuming is refused"


def test_resume_refuses_shards_of_another_codec(tmp_path):
    interrupted_dataset(tmp_path, 2)
    with pytest.raises(varstore.RecordTypeError, match="cannot resume: the interrupted run stores codec bytes"):
        varstore.ShardedWriter(tmp_path, codec="msgpack", resume=True)


def test_resume_refuses_a_committed_dataset(tmp_path):
    with varstore.ShardedWriter(tmp_path) as writer:
        writer.extend(RECORDS)
    with pytest.raises(varstore.ShardExistsError, match="resume=True continues only a writer"):
        varstore.ShardedWriter(tmp_path, resume=True)
    assert_store_holds(tmp_path, RECORDS)


def test_abort_after_resume_keeps_the_adopted_shards_for_the_next_resume(tmp_path):
    interrupted_dataset(tmp_path, 2)
    with pytest.raises(RuntimeError):
        with varstore.ShardedWriter(tmp_path, resume=True, max_shard_records=10) as writer:
            writer.extend(RECORDS[len(writer) : 35])
            raise RuntimeError("the job fails again")
    assert final_index_names(tmp_path) == ["shard-000000", "shard-000001"]
    assert resume(tmp_path) == 20
    assert_store_holds(tmp_path, RECORDS)


def killed_run(directory, records, **options) -> None:
    """A ShardedWriter that dies (its process ends) after appending `records`, before its manifest."""
    writer = varstore.ShardedWriter(directory, **options)
    writer.extend(records)
    writer._writer.abort()
    writer._writer = None
    writer._closed = True
    del writer


def test_resume_after_an_overwrite_with_other_shard_settings_holds_every_record_once(tmp_path):
    """Regression (issue 9, item 4): killed; restarted with overwrite=True and other shard limits, killed;
    resumed -> the old run's shards were adopted too, and records appeared twice."""
    killed_run(tmp_path, RECORDS[:33], max_shard_records=10)
    killed_run(tmp_path, RECORDS[:25], max_shard_records=4, overwrite=True)
    with varstore.ShardedWriter(tmp_path, resume=True, max_shard_records=4) as writer:
        assert len(writer) == 24
        writer.extend(RECORDS[len(writer) :])
    assert_store_holds(tmp_path, RECORDS)
    assert final_index_names(tmp_path) == [f"shard-{number:06d}" for number in range(4, 14)], "the first run's shards are gone"


def test_resume_continues_an_interrupted_overwrite_and_keeps_the_old_dataset_until_it_commits(tmp_path):
    old = RECORDS[:5]
    with varstore.ShardedWriter(tmp_path, max_shard_records=10) as writer:
        writer.extend(old)
    killed_run(tmp_path, RECORDS[:23], max_shard_records=10, overwrite=True)
    assert list(varstore.open(tmp_path)) == old
    with varstore.ShardedWriter(tmp_path, resume=True, max_shard_records=10) as writer:
        assert len(writer) == 20
        assert list(varstore.open(tmp_path)) == old
        writer.extend(RECORDS[len(writer) :])
    assert_store_holds(tmp_path, RECORDS)
    assert "shard-000000" not in final_index_names(tmp_path), "the replaced dataset's shards are removed"


def test_resume_is_refused_when_another_dataset_was_committed_since(tmp_path):
    killed_run(tmp_path, RECORDS[:23], max_shard_records=10)
    with pytest.raises(varstore.ShardExistsError, match="resume=True or overwrite=True|resume=True to continue"):
        varstore.ShardedWriter(tmp_path)
    with varstore.ShardedWriter(tmp_path, overwrite=True) as writer:
        writer.extend(RECORDS[:3])
    with pytest.raises(varstore.ShardExistsError, match="resume=True continues only"):
        varstore.ShardedWriter(tmp_path, resume=True)
    assert_store_holds(tmp_path, RECORDS[:3])


def test_resume_without_a_journal_refuses_shards_it_cannot_attribute(tmp_path):
    with varstore.Writer(tmp_path / "shard-000000") as writer:
        writer.append(b"whose?")
    with pytest.raises(varstore.VarstoreError, match="no writer journal"):
        varstore.ShardedWriter(tmp_path, resume=True)
    assert final_index_names(tmp_path) == ["shard-000000"]


def test_journal_line_torn_by_a_crash_is_ignored(tmp_path):
    interrupted_dataset(tmp_path, 2, last_committed=True)
    with open(tmp_path / ".varstore-journal", "ab") as journal:
        journal.write(b'0badc0de {"begun": "shard-0000')
    assert resume(tmp_path) == 23
    assert_store_holds(tmp_path, RECORDS)

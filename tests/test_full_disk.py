"""A ShardedWriter whose shard or manifest commit fails (a full disk) refuses every further record, never commits
a manifest that omits accepted records, keeps what it committed, and a resume then stores every record once."""

from __future__ import annotations

import errno
import os

import numpy as np
import pytest

import varstore
from varstore.format.manifest import MANIFEST_NAME

from .helpers_reliability import assert_store_holds, failing_call, final_index_names, make_records
from .helpers_tmpfs import fill, mounted_tmpfs

RECORDS = make_records(41, 60, 200)


def assert_refuses_everything(writer: varstore.ShardedWriter, failed: str, safe: int) -> None:
    message = rf"refused: {failed} failed .*{safe} records are safely committed.*resume=True"
    with pytest.raises(varstore.VarstoreError, match=message):
        writer.append(b"after the failure")
    with pytest.raises(varstore.VarstoreError, match=message):
        writer.extend([b"after the failure"])
    with pytest.raises(varstore.VarstoreError, match=message):
        writer.extend_flat(b"ab", [1, 1])
    with pytest.raises(varstore.VarstoreError, match=message):
        writer.close()
    assert not os.path.exists(os.path.join(writer.path, MANIFEST_NAME)), "no manifest omitting accepted records"


def resume_to_the_end(directory, expected_start: int, **options) -> None:
    with varstore.ShardedWriter(directory, resume=True, **options) as writer:
        assert len(writer) == expected_start
        writer.extend(RECORDS[len(writer) :])
    assert_store_holds(directory, RECORDS)


def test_failed_commit_at_a_rollover_refuses_further_records_and_resume_stores_each_once(tmp_path):
    """Regression (issue 9, item 3): after ENOSPC at a rollover the writer went on accepting records, and
    close() committed a manifest without the failed shard's records."""
    writer = varstore.ShardedWriter(tmp_path, max_shard_records=10)
    with failing_call("link", 3, errno.ENOSPC):  # the data file of shard-000001, the second shard committed
        with pytest.raises(varstore.StorageError, match=r"shard shard-000001 failed .*No space left.*10 records are safely committed in shards shard-000000 to shard-000000"):
            writer.extend(RECORDS)
    assert len(writer) == 20
    assert_refuses_everything(writer, "shard shard-000001", 10)
    writer.abort()  # keeps the committed shard after a failure
    assert final_index_names(tmp_path) == ["shard-000000"]
    resume_to_the_end(tmp_path, 10, max_shard_records=10)


def test_failed_manifest_commit_keeps_the_shards_for_a_resume(tmp_path):
    writer = varstore.ShardedWriter(tmp_path, max_shard_records=25)
    writer.extend(RECORDS)
    with failing_call("link", 3, errno.ENOSPC), pytest.raises(varstore.StorageError, match="the manifest commit failed"):
        writer.close()
    assert_refuses_everything(writer, "the manifest commit", 60)
    resume_to_the_end(tmp_path, 60, max_shard_records=25)


def test_write_error_in_extend_flat_fails_the_writer(tmp_path):
    writer = varstore.ShardedWriter(tmp_path, max_shard_records=10)
    writer.extend(RECORDS[:15])
    payload = b"".join(RECORDS[15:])
    with failing_call("write", 1, errno.EIO), pytest.raises(varstore.StorageError, match="shard shard-000001 failed"):
        writer.extend_flat(payload, [len(record) for record in RECORDS[15:]])
    assert_refuses_everything(writer, "shard shard-000001", 10)
    del writer  # dropped without abort: its lock goes, its shards stay
    resume_to_the_end(tmp_path, 10, max_shard_records=10)


def test_full_tmpfs_at_a_rollover_refuses_further_records_and_resume_stores_each_once():
    with mounted_tmpfs(1 << 20) as root:
        directory = root / "data"
        writer = varstore.ShardedWriter(directory, max_shard_records=20)
        writer.extend(RECORDS[:25])  # shard-000000 committed, shard-000001 begun
        fill(root)
        with pytest.raises(varstore.StorageError, match=r"shard shard-000001 failed .*No space left"):
            writer.extend(RECORDS[25:])
        os.unlink(root / "filler")  # the caller frees space and tries again
        assert_refuses_everything(writer, "shard shard-000001", 20)
        assert final_index_names(directory) == ["shard-000000"]
        resume_to_the_end(directory, 20, max_shard_records=20)
        assert np.sum([len(record) for record in varstore.open(directory)]) == sum(map(len, RECORDS))

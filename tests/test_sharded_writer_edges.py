"""ShardedWriter, its journal and write_manifest at their edges: interrupts, name races, limits, leftovers (issue 9 attacks)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

import varstore
import varstore.format.manifest
import varstore.local.manifest_file
import varstore.dataset.run_start
import varstore.dataset.local_target
import varstore.dataset.writer
from varstore.local.journal import JOURNAL_NAME, _line, read_journal
from varstore.local.locks import lock_shard
from varstore.format.manifest import MANIFEST_NAME

from .helpers_reliability import assert_store_holds, final_index_names, make_records

RECORDS = make_records(90, 60)


def dataset_files(names: list[str]) -> list[str]:
    return sorted([MANIFEST_NAME] + [name + suffix for name in names for suffix in (".data", ".index")])


def die(writer: varstore.ShardedWriter) -> None:
    """The writer's process ends before its manifest: the shard in progress is lost, its locks go."""
    if writer._writer is not None:
        writer._writer.abort()
        writer._writer = None
    writer._closed = True
    writer._journal.close()
    writer._lock.release()


def test_interrupt_after_the_manifest_commit_point_leaves_abort_nothing_to_delete(tmp_path, monkeypatch):
    """Regression (a20): Ctrl-C inside close() just after manifest.json was named made abort() delete every shard."""
    real_publish = varstore.local.manifest_file.publish_new

    def publish_then_interrupt(pairs):
        real_publish(pairs)
        raise KeyboardInterrupt

    writer = varstore.ShardedWriter(tmp_path, max_shard_records=20)
    writer.extend(RECORDS)
    monkeypatch.setattr(varstore.local.manifest_file, "publish_new", publish_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        writer.close()
    writer.abort()
    assert_store_holds(tmp_path, RECORDS)
    assert sorted(os.listdir(tmp_path)) == dataset_files(["shard-000000", "shard-000001", "shard-000002"])


def test_a_shard_name_taken_between_probe_and_lock_is_never_adopted_on_resume(tmp_path, monkeypatch):
    """Regression (a17): the journal named shard-000001 as this run's before its Writer owned it; a standalone
    Writer committed that name meanwhile, and resume adopted its records."""
    real_is_locked = varstore.dataset.writer.is_locked

    def foreign_writer_wins_the_window(path):
        taken = real_is_locked(path)
        if path.endswith("shard-000001.varstore-lock") and not (tmp_path / "shard-000001.index").exists():
            with varstore.Writer(tmp_path / "shard-000001") as foreign:
                foreign.extend([b"FOREIGN"] * 5)
        return taken

    writer = varstore.ShardedWriter(tmp_path, max_shard_records=20)
    monkeypatch.setattr(varstore.dataset.writer, "is_locked", foreign_writer_wins_the_window)
    with pytest.raises(varstore.ShardExistsError, match="resume=True"):
        writer.extend(RECORDS)
    monkeypatch.undo()
    assert "shard-000001" not in read_journal(str(tmp_path)).begun
    with varstore.ShardedWriter(tmp_path, resume=True, max_shard_records=20) as writer:
        assert writer.shard_names == ["shard-000000"]
        writer.extend(RECORDS[len(writer) :])
    assert_store_holds(tmp_path, RECORDS)
    assert list(varstore.open(tmp_path / "shard-000001")) == [b"FOREIGN"] * 5


def test_a_shard_name_locked_by_another_writer_fails_the_sharded_writer(tmp_path, monkeypatch):
    """Regression (a16): a ConcurrentWriterError from the next shard's Writer left the ShardedWriter accepting
    records, with the other writer's shard journaled as its own."""
    real_is_locked = varstore.dataset.writer.is_locked
    foreign_locks = []

    def foreign_writer_locks_in_the_window(path):
        taken = real_is_locked(path)
        if path.endswith("shard-000001.varstore-lock") and not foreign_locks:
            foreign_locks.append(lock_shard(str(tmp_path / "shard-000001")))
        return taken

    writer = varstore.ShardedWriter(tmp_path, max_shard_records=20)
    monkeypatch.setattr(varstore.dataset.writer, "is_locked", foreign_writer_locks_in_the_window)
    with pytest.raises(varstore.ConcurrentWriterError, match="resume=True"):
        writer.extend(RECORDS)
    with pytest.raises(varstore.VarstoreError, match="append refused"):
        writer.append(b"retried")
    assert read_journal(str(tmp_path)).begun == ["shard-000000"]
    foreign_locks[0].release()


def test_overwrite_refuses_a_shard_number_past_the_name_limit_before_touching_anything(tmp_path):
    """Regression (a07): numbering after a 200-character shard name made an invalid name; the overwrite reported
    success with a manifest no reader accepts, and the old shards were deleted."""
    longest = "shard-" + "9" * 194
    with varstore.Writer(tmp_path / longest) as writer:
        writer.append(b"old")
    varstore.write_manifest(tmp_path)
    before = sorted(os.listdir(tmp_path))
    with pytest.raises(varstore.FormatError, match="longer than 200 characters"):
        varstore.ShardedWriter(tmp_path, overwrite=True)
    assert sorted(os.listdir(tmp_path)) == before
    assert list(varstore.open(tmp_path)) == [b"old"]


def test_write_manifest_orders_numbered_shards_by_number(tmp_path):
    """Regression (a15): names sorted as strings put shard-1000000 before shard-999999, reordering records."""
    for number in (999998, 999999, 1000000, 1000001):
        with varstore.Writer(tmp_path / f"shard-{number:06d}") as writer:
            writer.append(b"rec-%d" % number)
    assert varstore.write_manifest(tmp_path) == ["shard-999998", "shard-999999", "shard-1000000", "shard-1000001"]
    assert list(varstore.open(tmp_path)) == [b"rec-999998", b"rec-999999", b"rec-1000000", b"rec-1000001"]


def test_a_relative_path_keeps_naming_the_same_directory_after_chdir(tmp_path, monkeypatch):
    """Regression (a01): the writer re-resolved its relative path after a chdir."""
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    monkeypatch.chdir(tmp_path / "one")
    writer = varstore.ShardedWriter("ds", max_shard_records=20)
    writer.extend(RECORDS[:30])
    monkeypatch.chdir(tmp_path / "two")
    writer.extend(RECORDS[30:])
    writer.close()
    assert writer.path == str(tmp_path / "one" / "ds")
    assert_store_holds(tmp_path / "one" / "ds", RECORDS)
    assert os.listdir(tmp_path / "two") == []


def test_a_resume_after_a_torn_journal_line_journals_its_own_shards_readably(tmp_path):
    """Regression (a10): the resume appended after the torn line, so its lines were glued to it and lost."""
    writer = varstore.ShardedWriter(tmp_path, max_shard_records=10)
    writer.extend(RECORDS[:25])
    die(writer)
    with open(tmp_path / JOURNAL_NAME, "ab") as journal:
        journal.write(b'0badc0de {"begun": "shard-0000')
    writer = varstore.ShardedWriter(tmp_path, resume=True, max_shard_records=10)
    assert len(writer) == 20
    writer.extend(RECORDS[20:45])
    die(writer)
    with varstore.ShardedWriter(tmp_path, resume=True, max_shard_records=10) as writer:
        assert len(writer) == 40
        writer.extend(RECORDS[len(writer) :])
    assert_store_holds(tmp_path, RECORDS)
    assert sorted(os.listdir(tmp_path)) == dataset_files([f"shard-{number:06d}" for number in range(6)])


def test_resuming_a_directory_leaves_a_hard_linked_snapshot_of_its_journal_alone(tmp_path):
    """Regression (a23): after `cp -al`, the resume appended through the shared journal inode into the snapshot."""
    original, snapshot = tmp_path / "original", tmp_path / "snapshot"
    writer = varstore.ShardedWriter(original, max_shard_records=10)
    writer.extend(RECORDS[:25])
    die(writer)
    snapshot.mkdir()
    for name in os.listdir(original):
        os.link(original / name, snapshot / name)
    journal_before = (snapshot / JOURNAL_NAME).read_bytes()
    with varstore.ShardedWriter(original, resume=True, max_shard_records=10) as writer:
        writer.extend(RECORDS[len(writer) :])
    assert (snapshot / JOURNAL_NAME).read_bytes() == journal_before
    with varstore.ShardedWriter(snapshot, resume=True, max_shard_records=10) as writer:
        assert len(writer) == 20
        writer.extend(RECORDS[len(writer) :])
    assert_store_holds(snapshot, RECORDS)


KILLED_WRITER = """
import os, sys, varstore
writer = varstore.ShardedWriter(sys.argv[1], max_shard_records=10, overwrite=True)
writer.extend([b"killed-%d" % i for i in range(25)])
os._exit(0)
"""


def test_overwrite_after_a_killed_run_removes_its_temporary_and_lock_files(tmp_path):
    """Regression (a12): the killed run's temporary files (up to a shard) and lock file stayed after a good overwrite."""
    subprocess.run([sys.executable, "-c", KILLED_WRITER, str(tmp_path)], check=True, timeout=60)
    assert any(".varstore-tmp-" in name for name in os.listdir(tmp_path))
    with varstore.ShardedWriter(tmp_path, max_shard_records=10, overwrite=True) as writer:
        writer.extend(RECORDS)
    assert sorted(os.listdir(tmp_path)) == dataset_files([f"shard-{number:06d}" for number in range(3, 9)])
    assert_store_holds(tmp_path, RECORDS)


def test_resume_removes_stale_shard_lock_files_but_not_held_ones(tmp_path):
    """Regression (a21): a writer killed between its shard commit and its lock release left a lock file forever."""
    writer = varstore.ShardedWriter(tmp_path, max_shard_records=10)
    writer.extend(RECORDS[:25])
    die(writer)
    (tmp_path / "shard-000000.varstore-lock").write_bytes(b"pid 1 on a dead host\n")
    with lock_shard(str(tmp_path / "standalone")):
        with varstore.ShardedWriter(tmp_path, resume=True, max_shard_records=10) as writer:
            writer.extend(RECORDS[len(writer) :])
        assert (tmp_path / "standalone.varstore-lock").exists(), "a live writer's lock is left alone"
    assert sorted(os.listdir(tmp_path)) == dataset_files([f"shard-{number:06d}" for number in range(6)])


def test_read_journal_is_linear_in_its_shard_count(tmp_path):
    """Regression (a27): begun names were checked against a list: 40000 shards took 15 s."""
    header = {"journal": "varstore-writer-journal", "run": "r", "codec": {"name": "bytes", "params": {}}, "replaces": None}
    lines = [_line(header)] + [_line({"begun": f"shard-{number:06d}"}) for number in range(40000)]
    (tmp_path / JOURNAL_NAME).write_bytes(b"".join(lines))
    started = time.monotonic()
    assert len(read_journal(str(tmp_path)).begun) == 40000
    assert time.monotonic() - started < 5


def test_a_journal_over_its_size_limit_is_refused_not_cut_short(tmp_path, monkeypatch):
    monkeypatch.setattr(varstore.format.manifest, "MAX_MANIFEST_SIZE", 1000)
    header = {"journal": "varstore-writer-journal", "run": "r", "codec": {"name": "bytes", "params": {}}, "replaces": None}
    lines = [_line(header)] + [_line({"begun": f"shard-{number:06d}"}) for number in range(100)]
    (tmp_path / JOURNAL_NAME).write_bytes(b"".join(lines))
    with pytest.raises(varstore.FormatError, match="over the limit"):
        read_journal(str(tmp_path))


def test_the_writer_refuses_a_shard_the_manifest_has_no_room_for_and_still_closes(tmp_path, monkeypatch):
    """Regression (a28): past the manifest cap the writer took every record and failed at close, on every resume."""
    monkeypatch.setattr(varstore.format.manifest, "MAX_MANIFEST_SIZE", 4096)
    writer = varstore.ShardedWriter(tmp_path, max_shard_records=1)
    with pytest.raises(varstore.FormatError, match="manifest would exceed its limit of 4096 bytes"):
        writer.extend(RECORDS)
    stored = len(writer)
    assert 1 < stored < len(RECORDS)
    with pytest.raises(varstore.FormatError, match="manifest would exceed"):
        writer.append(b"one more")
    writer.close()
    assert_store_holds(tmp_path, RECORDS[:stored])


def test_resume_refuses_a_journal_copied_from_another_directory(tmp_path):
    """Message fix: the journal's shards are not here, which used to surface as a bare MissingFileError."""
    writer = varstore.ShardedWriter(tmp_path / "source", max_shard_records=10)
    writer.extend(RECORDS[:35])
    die(writer)
    (tmp_path / "copy").mkdir()
    (tmp_path / "copy" / JOURNAL_NAME).write_bytes((tmp_path / "source" / JOURNAL_NAME).read_bytes())
    with pytest.raises(varstore.FormatError, match="does not describe this directory"):
        varstore.ShardedWriter(tmp_path / "copy", resume=True, max_shard_records=10)


def test_resume_after_an_overwrite_stopped_before_its_journal_says_there_is_nothing_to_resume(tmp_path):
    with varstore.ShardedWriter(tmp_path) as writer:
        writer.extend(RECORDS)
    with pytest.raises(varstore.ShardExistsError, match="nothing to resume.*no writer journal"):
        varstore.ShardedWriter(tmp_path, resume=True)
    assert final_index_names(tmp_path) == ["shard-000000"]


def test_interrupt_while_the_writer_starts_leaves_no_journal_and_no_lock(tmp_path, monkeypatch):
    """Ctrl-C landing just after a new run began its journal: nothing is left that a later writer must resume."""
    from varstore.dataset import run_start

    real_start = run_start._RunStart._start_run

    def start_then_interrupt(self, *args, **options):
        real_start(self, *args, **options)
        raise KeyboardInterrupt

    monkeypatch.setattr(run_start._RunStart, "_start_run", start_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        varstore.ShardedWriter(tmp_path / "data")
    assert os.listdir(tmp_path / "data") == []


def test_a_fifo_at_the_journal_path_is_refused_without_hanging(tmp_path):
    (tmp_path / "data").mkdir()
    os.mkfifo(tmp_path / "data" / JOURNAL_NAME)
    script = f"import varstore\nvarstore.ShardedWriter({str(tmp_path / 'data')!r})\n"
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and "not a regular file" in result.stderr


def test_interrupt_inside_the_manifest_commit_after_its_rename_still_removes_the_replaced_shards(tmp_path, monkeypatch):
    """Ctrl-C landing after the new manifest is named: close() raises, the dataset stands, and the old version's
    shards are removed all the same (they are listed by no manifest any more)."""
    with varstore.ShardedWriter(tmp_path, max_shard_records=2) as writer:
        writer.extend([b"old"] * 4)
    real_commit = varstore.dataset.local_target.commit_manifest_bytes

    def commit_then_interrupt(*args, **options):
        real_commit(*args, **options)
        raise KeyboardInterrupt

    monkeypatch.setattr(varstore.dataset.local_target, "commit_manifest_bytes", commit_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        with varstore.ShardedWriter(tmp_path, max_shard_records=2, overwrite=True) as writer:
            writer.extend([b"new"] * 3)
    assert list(varstore.open(tmp_path)) == [b"new"] * 3
    assert final_index_names(tmp_path) == ["shard-000002", "shard-000003"]
    assert sorted(name for name in os.listdir(tmp_path) if name.startswith(".")) == []


def test_a_kill_between_a_restart_and_its_cleanup_leaves_a_resumable_run(tmp_path):
    """An overwrite restarting a killed run replaces the journal before it deletes the old run's shards."""
    writer = varstore.ShardedWriter(tmp_path, max_shard_records=2)
    writer.extend([b"a"] * 5)
    del writer  # killed: two shards committed, no manifest
    pid = os.fork()
    if pid == 0:  # the restart, killed between the journal's replacement and the cleanup
        varstore.dataset.run_start._RunStart._remove_dead_writer_state = lambda self: os._exit(0)
        try:
            varstore.ShardedWriter(tmp_path, max_shard_records=2, overwrite=True)
        finally:
            os._exit(1)
    assert os.waitpid(pid, 0)[1] == 0
    with varstore.ShardedWriter(tmp_path, max_shard_records=2, resume=True) as resumed:
        assert len(resumed) == 0
        resumed.extend([b"b"] * 3)
    assert list(varstore.open(tmp_path)) == [b"b"] * 3

"""The writer journal's durability: each line is on disk before a writer relies on it, and no descriptor leaks
(the mutants of issue 23 that dropped an fsync or a close and passed every test)."""

from __future__ import annotations

import errno
import gc
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from varstore.errors import FormatError
from varstore.format.checksum import crc32c
from varstore.format.manifest import ShardEntry
from varstore.local.journal import Journal, journal_path, manifest_identity, max_journal_size, new_run, read_journal

ENTRY = ShardEntry("shard-000000", records=3, data_size=30, index_size=120, index_crc32c=7, data_crc32c=9)


class SyncLog:
    """Wraps os.fsync and os.replace, recording in order what each synced (inode, size, directory?) or renamed."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, fail_on: str | None = None) -> None:
        self.events: list[tuple[Any, ...]] = []
        self._fsync, self._replace, self._fail_on = os.fsync, os.replace, fail_on
        monkeypatch.setattr(os, "fsync", self.fsync)
        monkeypatch.setattr(os, "replace", self.replace)

    def fsync(self, fd: int) -> None:
        info = os.fstat(fd)
        kind = "directory" if stat.S_ISDIR(info.st_mode) else "file"
        if kind == self._fail_on:
            raise OSError(errno.EIO, "planted fsync failure")
        self._fsync(fd)
        self.events.append(("fsync", kind, info.st_ino, info.st_size))

    def replace(self, source: str, destination: str) -> None:
        self._replace(source, destination)
        self.events.append(("replace", os.path.basename(destination)))


def descriptors_open_on(path: str) -> int:
    """How many of this process's file descriptors have the file `path` names now open (even once it is unlinked)."""
    target = os.stat(path)
    count = 0
    for name in os.listdir("/proc/self/fd"):
        try:
            info = os.stat(f"/proc/self/fd/{name}")
        except FileNotFoundError:
            continue  # the descriptor os.listdir itself used
        count += (info.st_dev, info.st_ino) == (target.st_dev, target.st_ino)
    return count


def started_run() -> Any:
    run = new_run("bytes", {}, None)
    run.begun = ["shard-000000", "shard-000001"]
    run.committed = {"shard-000000": ENTRY}
    return run


def test_a_started_journal_is_synced_whole_before_its_rename_and_its_directory_after(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = SyncLog(monkeypatch)
    journal = Journal.start(str(tmp_path), started_run())
    journal.close()
    final = os.stat(journal_path(str(tmp_path)))
    renamed = log.events.index(("replace", ".varstore-journal"))
    assert ("fsync", "file", final.st_ino, final.st_size) in log.events[:renamed]
    assert ("fsync", "directory", tmp_path.stat().st_ino, tmp_path.stat().st_size) in log.events[renamed:]


def test_each_recorded_line_is_synced_before_record_returns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    journal = Journal.start(str(tmp_path), started_run())
    log = SyncLog(monkeypatch)
    journal.record(ENTRY, "shard-000002")
    synced = os.stat(journal_path(str(tmp_path)))
    journal.record(None, "shard-000003")
    final = os.stat(journal_path(str(tmp_path)))
    journal.close()
    assert final.st_size > synced.st_size
    assert log.events == [("fsync", "file", synced.st_ino, synced.st_size), ("fsync", "file", final.st_ino, final.st_size)]
    assert read_journal(str(tmp_path)).begun == [f"shard-00000{number}" for number in range(4)]


def test_a_journal_holds_one_descriptor_while_open_and_none_after_close_or_remove(tmp_path: Path) -> None:
    path = journal_path(str(tmp_path))
    journal = Journal.start(str(tmp_path), started_run())
    assert descriptors_open_on(path) == 1
    journal.record(ENTRY, None)
    journal.close()
    assert descriptors_open_on(path) == 0
    continued = Journal.continue_run(str(tmp_path))
    linked = tmp_path / "still-linked"  # a second name, to find the file once remove() unlinked the journal
    os.link(path, linked)
    assert descriptors_open_on(str(linked)) == 1
    continued.remove()
    assert descriptors_open_on(str(linked)) == 0
    assert os.listdir(tmp_path) == ["still-linked"]


def test_a_journal_dropped_without_close_lets_go_of_its_descriptor(tmp_path: Path) -> None:
    journal = Journal.start(str(tmp_path), started_run())
    assert descriptors_open_on(journal_path(str(tmp_path))) == 1
    del journal
    gc.collect()
    assert descriptors_open_on(journal_path(str(tmp_path))) == 0


def test_reading_the_manifest_identity_leaves_no_descriptor_open(tmp_path: Path) -> None:
    (tmp_path / "manifest.json").write_bytes(b"{}")
    assert manifest_identity(str(tmp_path)) == crc32c(b"{}")
    assert descriptors_open_on(str(tmp_path / "manifest.json")) == 0


@pytest.mark.parametrize("failing", ["file", "directory"])
def test_a_journal_that_cannot_be_synced_raises_and_leaves_no_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing: str) -> None:
    SyncLog(monkeypatch, fail_on=failing)
    with pytest.raises(OSError, match="planted fsync failure"):
        Journal.start(str(tmp_path), started_run())
    assert os.listdir(tmp_path) == []
    assert read_journal(str(tmp_path)) is None


def test_a_journal_file_is_readable_by_all_and_writable_by_its_owner_only(tmp_path: Path) -> None:
    umask = os.umask(0o022)
    try:
        Journal.start(str(tmp_path), started_run()).close()
    finally:
        os.umask(umask)
    assert stat.S_IMODE(os.stat(journal_path(str(tmp_path))).st_mode) == 0o644


def test_a_manifest_that_is_a_symbolic_link_has_an_identity_no_manifest_has(tmp_path: Path) -> None:
    """A resume compares this identity with its journal's: a planted link is neither a missing nor a real manifest."""
    assert manifest_identity(str(tmp_path)) is None
    (tmp_path / "elsewhere.json").write_text("{}")
    (tmp_path / "manifest.json").symlink_to(tmp_path / "elsewhere.json")
    assert manifest_identity(str(tmp_path)) == -1


def test_a_journal_larger_than_any_writer_writes_is_refused_unread(tmp_path: Path) -> None:
    Journal.start(str(tmp_path), started_run()).close()
    os.truncate(journal_path(str(tmp_path)), max_journal_size() + 1)  # sparse: its valid lines, then zeros
    with pytest.raises(FormatError, match=f"the writer journal is {max_journal_size() + 1} bytes, over the limit"):
        read_journal(str(tmp_path))
    os.truncate(journal_path(str(tmp_path)), max_journal_size())
    assert read_journal(str(tmp_path)).begun == ["shard-000000", "shard-000001"]

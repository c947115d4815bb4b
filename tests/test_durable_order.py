"""The order of durable calls in a commit: each file is fsynced before its final name appears, the data file is
named before the index (the commit point), the directory is fsynced after; likewise the manifest.

Kills cannot see a missing fsync (the page cache survives a killed process), so this test watches the calls."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

import varstore
from varstore.format.manifest import MANIFEST_NAME

RECORDS = [b"a" * 10, b"b" * 2000, b""]


class DurableCalls:
    """Records ("fsync", path), ("name", final path) and ("unlink", path) in call order; fds are resolved to paths."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.events: list[tuple[str, str]] = []
        self._paths: dict[int, str] = {}
        original_open, original_fsync = os.open, os.fsync
        originals = {name: getattr(os, name) for name in ("link", "replace", "rename")}

        def open_(path: Any, *args: Any, **kwargs: Any) -> int:
            fd = original_open(path, *args, **kwargs)
            self._paths[fd] = os.path.abspath(os.fspath(path))
            return fd

        def fsync(fd: int) -> None:
            original_fsync(fd)
            self.events.append(("fsync", self._paths.get(fd, f"fd {fd}")))

        def naming(name: str) -> Any:
            def call(source: Any, destination: Any, *args: Any, **kwargs: Any) -> None:
                originals[name](source, destination, *args, **kwargs)
                self.events.append(("name", os.path.abspath(os.fspath(destination))))

            return call

        monkeypatch.setattr(os, "open", open_)
        monkeypatch.setattr(os, "fsync", fsync)
        for name in originals:
            monkeypatch.setattr(os, name, naming(name))

    def position(self, event: tuple[str, str]) -> int:
        assert event in self.events, f"{event} never happened: {self.events}"
        return self.events.index(event)

    def fsync_of_temporary(self, final: Path) -> int:
        """Where the temporary file that became `final` was fsynced (the last such fsync)."""
        prefix = str(final) + ".varstore-tmp-"
        found = [number for number, (kind, path) in enumerate(self.events) if kind == "fsync" and path.startswith(prefix)]
        assert found, f"{final}'s temporary file was never fsynced: {self.events}"
        return found[-1]

    def directory_fsyncs(self, directory: Path) -> list[int]:
        return [number for number, event in enumerate(self.events) if event == ("fsync", str(directory))]


def assert_shard_committed_in_order(calls: DurableCalls, prefix: Path) -> None:
    data, index = Path(f"{prefix}.data"), Path(f"{prefix}.index")
    data_named, index_named = calls.position(("name", str(data))), calls.position(("name", str(index)))
    assert calls.fsync_of_temporary(data) < data_named, "the data file is fsynced before its name appears"
    assert calls.fsync_of_temporary(index) < index_named, "the index is fsynced before its name appears"
    assert data_named < index_named, "the data file is named before the index, the commit point"
    assert any(number > index_named for number in calls.directory_fsyncs(prefix.parent)), "the directory is fsynced after"


@pytest.mark.parametrize("overwrite", [False, True])
def test_writer_commit_fsyncs_each_file_before_naming_it_and_the_directory_after(tmp_path, monkeypatch, overwrite):
    calls = DurableCalls(monkeypatch)
    with varstore.Writer(tmp_path / "docs", overwrite=overwrite) as writer:
        writer.extend(RECORDS)
    assert_shard_committed_in_order(calls, tmp_path / "docs")


@pytest.mark.parametrize("overwrite", [False, True])
def test_sharded_writer_close_fsyncs_shards_then_the_manifest_before_naming_it_and_the_directory_after(tmp_path, monkeypatch, overwrite):
    if overwrite:
        with varstore.ShardedWriter(tmp_path, max_shard_records=2) as writer:
            writer.extend(RECORDS)
    calls = DurableCalls(monkeypatch)
    with varstore.ShardedWriter(tmp_path, max_shard_records=2, overwrite=overwrite) as writer:
        writer.extend(RECORDS)
    names = writer.shard_names
    for name in names:
        assert_shard_committed_in_order(calls, tmp_path / name)
    manifest = tmp_path / MANIFEST_NAME
    manifest_named = calls.position(("name", str(manifest)))
    assert calls.fsync_of_temporary(manifest) < manifest_named, "the manifest is fsynced before its name appears"
    last_shard_named = calls.position(("name", str(tmp_path / f"{names[-1]}.index")))
    assert last_shard_named < manifest_named, "every shard is committed before the manifest"
    assert any(number > manifest_named for number in calls.directory_fsyncs(tmp_path)), "the directory is fsynced after"

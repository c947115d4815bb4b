"""ENOSPC and EIO at every file-changing OS call of a commit give a StorageError, leave no temporary
file, and leave under the final names either nothing or (when only the fsync after the commit rename
failed, which the error says) the complete store.

The parametrisation is the fault matrix: operation x call site x fault kind, each failing the 1st, 2nd,
... call at that site in turn.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Callable

import pytest

import varstore
from varstore.format.manifest import MANIFEST_NAME

from .helpers_reliability import (
    FAULTS,
    assert_store_holds,
    count_calls,
    failing_call,
    final_index_names,
    make_records,
    temporary_files,
)

RECORDS = make_records(11, 40) + [b"\x01" * (1 << 20)] + make_records(12, 10)
COMMITTED_MARK = "committed, but"


def write_shard(directory: Path) -> None:
    with varstore.Writer(directory / "docs") as writer:
        writer.extend(RECORDS)


def write_dataset(directory: Path) -> None:
    with varstore.ShardedWriter(directory / "data", max_shard_records=15) as writer:
        writer.extend(RECORDS)


def check_shard(directory: Path, error: varstore.StorageError) -> None:
    if COMMITTED_MARK in str(error):
        assert_store_holds(directory / "docs", RECORDS)
    else:
        assert not (directory / "docs.index").exists() and not (directory / "docs.data").exists()


def check_dataset(directory: Path, error: varstore.StorageError) -> None:
    directory = directory / "data"
    if not directory.exists():
        return
    if (directory / MANIFEST_NAME).exists():
        assert COMMITTED_MARK in str(error)
        assert_store_holds(directory, RECORDS)
    elif COMMITTED_MARK not in str(error):
        # A failed writer keeps the shards it committed, and its journal, for a resume that stores every record once.
        with varstore.ShardedWriter(directory, resume=True, max_shard_records=15) as writer:
            writer.extend(RECORDS[len(writer) :])
        assert_store_holds(directory, RECORDS)
        return
    # A shard whose directory fsync failed after its rename stays, whole, outside any manifest.
    for name in final_index_names(directory):
        with varstore.open(directory / name) as shard:
            shard.verify()


def prepare_shards(directory: Path) -> None:
    for number, start in enumerate(range(0, len(RECORDS), 20)):
        with varstore.Writer(directory / f"part-{number}") as writer:
            writer.extend(RECORDS[start : start + 20])


def combine_shards(directory: Path) -> None:
    varstore.write_manifest(directory)


def check_combined(directory: Path, error: varstore.StorageError) -> None:
    if COMMITTED_MARK in str(error):
        assert_store_holds(directory, RECORDS)
    else:
        assert not (directory / MANIFEST_NAME).exists()


OPERATIONS: dict[str, tuple[Callable[[Path], None], Callable[[Path], None], Callable[[Path, varstore.StorageError], None]]] = {
    "Writer": (lambda directory: None, write_shard, check_shard),
    "ShardedWriter": (lambda directory: None, write_dataset, check_dataset),
    "write_manifest": (prepare_shards, combine_shards, check_combined),
}
SITES = ("open", "write", "pwrite", "fsync", "replace", "link")


def calls_at(operation: str, site: str, root: Path) -> int:
    prepare, work, _ = OPERATIONS[operation]
    directory = root / "counting"
    directory.mkdir()
    prepare(directory)
    return count_calls(lambda: work(directory)).count(site)


@pytest.mark.parametrize("kind", list(FAULTS))
@pytest.mark.parametrize("site", SITES)
@pytest.mark.parametrize("operation", list(OPERATIONS))
def test_fault_at_every_call_is_a_storage_error_leaving_nothing_half_written(memory_path, operation, site, kind):
    prepare, work, check = OPERATIONS[operation]
    count = calls_at(operation, site, memory_path)
    if count == 0:
        assert (operation, site) in {("write_manifest", "pwrite"), ("write_manifest", "replace"), ("Writer", "replace")}
        return
    for nth in range(1, count + 1):
        directory = memory_path / f"fault-{nth}"
        directory.mkdir()
        prepare(directory)
        with pytest.raises(varstore.StorageError) as caught, failing_call(site, nth, FAULTS[kind]):
            work(directory)
        try:
            assert os.strerror(FAULTS[kind]) in str(caught.value)
            for root, _, _ in os.walk(directory):
                assert temporary_files(root) == []
            check(directory, caught.value)
        except AssertionError as failure:
            raise AssertionError(f"{kind} at call {nth} of os.{site}: {caught.value}: {failure}") from failure


@pytest.mark.parametrize("site", SITES)
def test_fault_while_overwriting_a_shard_never_yields_wrong_records(memory_path, site):
    old = make_records(13, 30)

    def overwrite(prefix: Path) -> None:
        with varstore.Writer(prefix, overwrite=True) as writer:
            writer.extend(RECORDS)

    count = count_calls(lambda: overwrite(memory_path / "counting")).count(site)
    if site == "link":
        assert count == 0, "overwriting renames"
        return
    assert count > 0
    for nth in range(1, count + 1):
        prefix = memory_path / f"fault-{nth}" / "docs"
        with varstore.Writer(prefix) as writer:
            writer.extend(old)
        with pytest.raises(varstore.StorageError), failing_call(site, nth, errno.EIO):
            overwrite(prefix)
        try:
            store = varstore.open(prefix)
        except varstore.VarstoreError:
            continue  # refused: the old index lost its data file to the half-finished replacement
        with store:
            store.verify()
            assert list(store) in (old, RECORDS)


@pytest.mark.parametrize("site", ("open", "pread"))
def test_io_error_while_opening_a_shard_is_a_storage_error(tmp_path, site):
    write_shard(tmp_path)
    count = count_calls(lambda: varstore.open(tmp_path / "docs").close(), (site,)).count(site)
    assert count > 0
    for nth in range(1, count + 1):
        with pytest.raises(varstore.StorageError, match=os.strerror(errno.EIO)), failing_call(site, nth, errno.EIO):
            varstore.open(tmp_path / "docs")


def test_short_writes_are_continued_until_every_byte_is_written(memory_path, monkeypatch):
    original_write = os.write
    monkeypatch.setattr(os, "write", lambda fd, data: original_write(fd, bytes(memoryview(data)[:7])))
    write_dataset(memory_path)
    monkeypatch.undo()
    assert_store_holds(memory_path / "data", RECORDS)


def test_directory_that_cannot_be_created_is_a_storage_error(tmp_path):
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(varstore.StorageError):
        varstore.ShardedWriter(tmp_path / "file" / "data")
    with pytest.raises(varstore.StorageError):
        varstore.Writer(tmp_path / "file" / "docs")

"""A writer SIGKILLed anywhere leaves only complete, correct shards under final names, and a restarted
ShardedWriter(resume=True) finishes the dataset exactly as an uninterrupted writer would have.

A forked child writes; it is killed before each of its file-changing OS calls in turn (so every step of
every commit, renames included, is a kill point), and at random moments while it appends.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

import varstore
from varstore.format.header import DATA_SUFFIX
from varstore.format.manifest import MANIFEST_NAME
from varstore.local.publish import TEMP_MARK

from .helpers_reliability import (
    assert_store_holds,
    count_calls,
    exited_cleanly,
    final_index_names,
    killed,
    make_records,
    run_killed_child,
    temporary_files,
)

# Datasets small enough to fork hundreds of times, large enough to hold several shards, empty records,
# a record over the writer's 1 MiB buffer (written directly) and shards with and without record checksums.
SHARDED_WORKLOADS = {
    "by-records": (dict(max_shard_records=7), make_records(1, 30)),
    "by-bytes-without-checksums": (dict(max_shard_bytes=2000, checksums=False), make_records(2, 40)),
    "with-a-big-record": (dict(max_shard_bytes=4000), make_records(3, 12, 900) + [bytes(range(256)) * 4200] + make_records(4, 5)),
}


def write_sharded(directory: Path, records: list[bytes], options: dict[str, Any]) -> None:
    with varstore.ShardedWriter(directory, **options) as writer:
        writer.extend(records)


def reference_layout(root: Path, records: list[bytes], options: dict[str, Any]) -> dict[str, list[bytes]]:
    """Shard name -> records, as an uninterrupted writer lays the dataset out."""
    directory = root / "reference"
    write_sharded(directory, records, options)
    return {name: list(varstore.open(directory / name)) for name in final_index_names(directory)}


def check_sharded_after_crash(directory: Path, records: list[bytes], options: dict[str, Any],
                              layout: dict[str, list[bytes]]) -> None:
    """Every committed shard is whole; the manifest, if any, is the whole dataset; resuming completes it."""
    if not directory.exists():
        return
    committed = final_index_names(directory)
    assert committed == list(layout)[: len(committed)], "shards are committed in order, without gaps"
    for name in committed:
        assert_store_holds(directory / name, layout[name])
    half_published = [name for name in os.listdir(directory) if name.endswith(DATA_SUFFIX)
                      and name[: -len(DATA_SUFFIX)] not in committed and TEMP_MARK not in name]
    assert len(half_published) <= 1
    if (directory / MANIFEST_NAME).exists():
        assert_store_holds(directory, records)
        with pytest.raises(varstore.ShardExistsError, match="resume"):
            varstore.ShardedWriter(directory, resume=True, **options)
        return
    with varstore.ShardedWriter(directory, resume=True, **options) as writer:
        assert len(writer) == sum(len(layout[name]) for name in committed)
        writer.extend(records[len(writer) :])
    assert_store_holds(directory, records)
    assert final_index_names(directory) == list(layout)
    assert [entry.name for entry in varstore.open(directory).manifest.shards] == list(layout)
    assert temporary_files(directory) == []


def kill_at_every_call(root: Path, work: Callable[[Path], None], check: Callable[[Path], None]) -> int:
    """Kill a child running `work` before each of its OS calls in turn (and once never); check after each.
    Returns the number of runs that were killed."""
    calls = count_calls(lambda: work(root / "counting"))
    kills = 0
    for kill_point in range(1, len(calls) + 2):
        directory = root / f"kill-{kill_point}"
        status = run_killed_child(lambda: work(directory), kill_point)
        expected_kill = kill_point <= len(calls)
        assert killed(status) if expected_kill else exited_cleanly(status), (kill_point, status)
        kills += expected_kill
        try:
            check(directory)
        except AssertionError as error:
            raise AssertionError(f"after a kill before call {kill_point} ({calls[kill_point - 1:kill_point]}): {error}") from error
        shutil.rmtree(directory, ignore_errors=True)  # one case at a time in memory: /dev/shm may be 64 MiB
    return kills


@pytest.mark.parametrize("workload", list(SHARDED_WORKLOADS))
def test_sharded_writer_killed_before_any_os_call_leaves_whole_shards_and_resumes(memory_path, workload):
    options, records = SHARDED_WORKLOADS[workload]
    layout = reference_layout(memory_path, records, options)
    assert len(layout) >= 3
    kills = kill_at_every_call(
        memory_path,
        lambda directory: write_sharded(directory, records, options),
        lambda directory: check_sharded_after_crash(directory, records, options, layout),
    )
    assert kills >= 4 * len(layout)


def test_single_writer_killed_before_any_os_call_leaves_the_whole_shard_or_no_index(memory_path):
    records = make_records(5, 50) + [b"z" * (1 << 20)]

    def work(directory: Path) -> None:
        with varstore.Writer(directory / "docs", overwrite=True) as writer:
            writer.extend(records)

    def check(directory: Path) -> None:
        if not directory.exists():
            return
        if final_index_names(directory):
            assert_store_holds(directory / "docs", records)
        else:
            with pytest.raises(varstore.MissingFileError):
                varstore.open(directory / "docs")
        varstore.remove_temporary_files(directory)
        assert temporary_files(directory) == []

    assert kill_at_every_call(memory_path, work, check) >= 10


def test_overwriting_writer_killed_anywhere_leaves_the_old_shard_or_the_new_one(memory_path):
    old, new = make_records(6, 20), make_records(7, 25)

    def work(directory: Path) -> None:
        with varstore.Writer(directory / "docs", overwrite=True) as writer:
            writer.extend(new)

    def check(directory: Path) -> None:
        # The old index is deleted before the renames: killed in between, there is no shard at all.
        try:
            store = varstore.open(directory / "docs")
        except varstore.MissingFileError:
            return
        with store:
            assert list(store) in (old, new)
            store.verify()

    for kill_point in range(1, len(count_calls(lambda: work(memory_path / "counting"))) + 2):
        directory = memory_path / f"kill-{kill_point}"
        with varstore.Writer(directory / "docs") as writer:
            writer.extend(old)
        run_killed_child(lambda: work(directory), kill_point)
        check(directory)
        shutil.rmtree(directory)


def kill_while_appending(directory: Path, records: list[bytes], options: dict[str, Any], reports_before_kill: int) -> bool:
    """A child appends `records`, reporting each through a pipe; it is killed once `reports_before_kill`
    reports have arrived, wherever it has got to by then. Returns False if it had finished first."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(read_end)
        try:
            with varstore.ShardedWriter(directory, **options) as writer:
                for record in records:
                    writer.append(record)
                    os.write(write_end, b".")
        finally:
            os._exit(0)
    os.close(write_end)
    seen = 0
    while seen < reports_before_kill:
        chunk = os.read(read_end, 4096)
        if not chunk:
            break
        seen += len(chunk)
    os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    os.close(read_end)
    return killed(status)


@pytest.mark.parametrize("seed", range(4))
def test_sharded_writer_killed_at_random_moments_while_appending_resumes_to_the_same_dataset(memory_path, seed):
    options, records = SHARDED_WORKLOADS["by-records"]
    records = records * 20
    layout = reference_layout(memory_path, records, options)
    generator = random.Random(seed)
    for run in range(10):
        directory = memory_path / f"run-{run}"
        kill_while_appending(directory, records, options, generator.randint(1, len(records) + 2))
        check_sharded_after_crash(directory, records, options, layout)
        shutil.rmtree(directory, ignore_errors=True)


def test_resume_after_a_crash_during_resume_still_completes_the_dataset(memory_path):
    options, records = SHARDED_WORKLOADS["by-records"]
    layout = reference_layout(memory_path, records, options)
    directory = memory_path / "data"
    first_run_calls = len(count_calls(lambda: write_sharded(memory_path / "counting", records, options)))
    assert killed(run_killed_child(lambda: write_sharded(directory, records, options), first_run_calls // 2))

    def resume(target: Path = directory) -> None:
        with varstore.ShardedWriter(target, resume=True, **options) as writer:
            writer.extend(records[len(writer) :])

    assert killed(run_killed_child(resume, 5))
    check_sharded_after_crash(directory, records, options, layout)


def test_sharded_overwrite_killed_anywhere_leaves_the_old_dataset_or_the_new_one_readable(memory_path):
    """Regression: an overwriting ShardedWriter used to replace the live dataset's shard files before its
    manifest committed, so a crash left the old manifest pointing at new shards (refused, or worse)."""
    old, new = make_records(8, 30), make_records(9, 33)
    options = dict(max_shard_records=7, overwrite=True)
    write_sharded(memory_path / "counting", old, dict(max_shard_records=7))
    calls = count_calls(lambda: write_sharded(memory_path / "counting", new, options))
    for kill_point in range(1, len(calls) + 1):
        directory = memory_path / f"kill-{kill_point}"
        write_sharded(directory, old, dict(max_shard_records=7))
        assert killed(run_killed_child(lambda: write_sharded(directory, new, options), kill_point))
        with varstore.open(directory) as dataset:
            dataset.verify()
            assert list(dataset) in (old, new)
        shutil.rmtree(directory)


# -- the order of durable calls ----------------------------------------------------------------------
# A kill cannot see a missing fsync (the page cache survives it); a power loss can. So the order itself
# is checked: every file is fsynced after its last write and before it gets a final name, every
# directory that got new names is fsynced after the last of them, and before a manifest naming them.

_NAMING_CALLS = ("link", "replace", "rename")


def _fd_path(fd: int) -> str:
    return os.readlink(f"/proc/self/fd/{fd}")


@contextlib.contextmanager
def durable_calls() -> Iterator[list[tuple[str, ...]]]:
    """Record ("write" | "fsync", path) and (naming call, source, target) for the os calls made inside."""
    events: list[tuple[str, ...]] = []
    originals = {name: getattr(os, name) for name in ("write", "pwrite", "fsync", *_NAMING_CALLS)}

    def wrapped(name: str) -> Callable[..., Any]:
        original = originals[name]

        def call(*args: Any, **kwargs: Any) -> Any:
            if name in _NAMING_CALLS:
                events.append((name, os.path.realpath(args[0]), os.path.realpath(args[1])))
            else:
                events.append(("fsync" if name == "fsync" else "write", _fd_path(args[0])))
            return original(*args, **kwargs)

        return call

    for name in originals:
        setattr(os, name, wrapped(name))
    try:
        yield events
    finally:
        for name, original in originals.items():
            setattr(os, name, original)


def assert_synced_before_named(events: list[tuple[str, ...]], root: Path) -> None:
    root = Path(os.path.realpath(root))
    written_since_fsync: set[str] = set()
    directories_to_sync: set[str] = set()
    namings = 0
    for event in events:
        if event[0] == "write":
            written_since_fsync.add(event[1])
        elif event[0] == "fsync":
            written_since_fsync.discard(event[1])
            directories_to_sync.discard(event[1])
        elif root in Path(event[2]).parents:
            namings += 1
            assert event[1] not in written_since_fsync, f"{event[1]} was named {event[2]} before its data was fsynced"
            if os.path.basename(event[2]) == MANIFEST_NAME:
                assert not directories_to_sync, f"the manifest was committed before the names in {directories_to_sync}"
            directories_to_sync.add(os.path.dirname(event[2]))
    assert namings, "nothing was named: the test saw no commit"
    assert not directories_to_sync, f"new names in {sorted(directories_to_sync)} were not fsynced after the commit"


@pytest.mark.parametrize("scenario", ["new shard", "overwritten shard", "dataset", "overwritten dataset"])
def test_every_file_is_fsynced_before_its_final_name_and_each_directory_after(tmp_path, scenario):
    records = make_records(10, 30) + [b"w" * (1 << 20)]  # past the writer's buffer: written directly too
    if scenario.startswith("overwritten"):
        with varstore.ShardedWriter(tmp_path / "data", max_shard_records=8) as writer:
            writer.extend(records[:9])
        with varstore.Writer(tmp_path / "docs") as writer:
            writer.extend(records[:3])
    with durable_calls() as events:
        if scenario.endswith("shard"):
            with varstore.Writer(tmp_path / "docs", overwrite=scenario.startswith("overwritten")) as writer:
                writer.extend(records)
        else:
            with varstore.ShardedWriter(tmp_path / "data", max_shard_records=8,
                                        overwrite=scenario.startswith("overwritten")) as writer:
                writer.extend(records)
    assert_synced_before_named(events, tmp_path)
    assert_store_holds(tmp_path / ("docs" if scenario.endswith("shard") else "data"), records)

"""varstore.dataset.parts: task attempts write part shards, the driver commits one manifest listing the successful ones."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import varstore
from varstore.dataset.parts import PartWriter, abandon_run, commit_parts, new_run_id
from varstore.remote.filesystems import list_sizes, open_filesystem

PARTS = [[f"part {part} record {index}".encode() * (index % 3 + 1) for index in range(7)] for part in range(3)]


def write_part(destination: Any, run_id: str, part: int, attempt: int, records: list[Any], **options: Any) -> list[dict[str, Any]]:
    with PartWriter(destination, run_id=run_id, part=part, attempt=attempt, max_shard_records=3, **options) as writer:
        writer.extend(records)
    return writer.close()


def serial_records(tmp_path: Path, records: list[Any], **options: Any) -> list[Any]:
    with varstore.ShardedWriter(tmp_path / "serial", max_shard_records=3, **options) as writer:
        writer.extend(records)
    return list(varstore.open(tmp_path / "serial"))


def shard_files(directory: Path) -> set[str]:
    return {name for name in os.listdir(directory) if name != "manifest.json"}


def listed_files(directory: Path) -> set[str]:
    manifest = varstore.open(directory).manifest
    return {entry.name + suffix for entry in manifest.shards for suffix in (".data", ".index")}


def object_names(url: str, options: dict[str, Any]) -> set[str]:
    """The names of the objects directly under `url` (none: S3 has no empty folders)."""
    fs, root = open_filesystem(url, options)
    try:
        return set(list_sizes(fs, root, url=url))
    except varstore.MissingFileError:
        return set()


def test_parts_committed_in_part_order_equal_the_serial_writer_whatever_order_tasks_finish(tmp_path: Path) -> None:
    destination, run_id = tmp_path / "dataset", new_run_id()
    finished = {part: write_part(destination, run_id, part, 0, PARTS[part]) for part in (2, 0, 1)}
    names = commit_parts(destination, [finished[part] for part in range(3)], run_id=run_id, metadata={"source": "test"})
    dataset = varstore.open(destination)
    assert list(dataset) == serial_records(tmp_path, [record for part in PARTS for record in part])
    assert [entry.name for entry in dataset.manifest.shards] == names == sorted(names)
    assert dataset.manifest.metadata == {"source": "test"}
    dataset.verify()  # raises on any shard that does not match its entry
    assert shard_files(destination) == listed_files(destination)  # no staging directory left either


def test_flat_ndarray_parts_equal_the_serial_writer(tmp_path: Path) -> None:
    values = np.arange(60, dtype=np.int32).reshape(30, 2)
    lengths = np.array([1, 4, 0, 3, 2, 5, 3, 2, 6, 4])
    options = {"codec": "ndarray", "dtype": "int32", "shape": (2,)}
    destination, run_id = tmp_path / "dataset", new_run_id()
    ends = np.cumsum(lengths)
    entries = []
    for part, (first, last) in enumerate([(0, 4), (4, 10)]):
        with PartWriter(destination, run_id=run_id, part=part, attempt=0, max_shard_records=3, **options) as writer:
            start = ends[first - 1] if first else 0
            writer.extend_flat(values[start : ends[last - 1]], lengths[first:last])
        entries.append(writer.close())
    commit_parts(destination, entries, run_id=run_id, **options)
    with varstore.ShardedWriter(tmp_path / "serial", max_shard_records=3, **options) as serial:
        serial.extend_flat(values, lengths)
    expected = list(varstore.open(tmp_path / "serial"))
    assert [record.tolist() for record in varstore.open(destination)] == [record.tolist() for record in expected]


def test_failed_and_abandoned_attempts_leave_nothing_and_are_never_listed(tmp_path: Path) -> None:
    destination, run_id = tmp_path / "dataset", new_run_id()
    with pytest.raises(RuntimeError, match="task failed"):
        with PartWriter(destination, run_id=run_id, part=1, attempt=0, max_shard_records=2) as failing:
            failing.extend(PARTS[1])  # three shards published before the failure
            raise RuntimeError("task failed")
    assert not any(name.startswith(f"part-{run_id}-000001-0") for name in os.listdir(destination))
    # An attempt killed mid-way: shards published, its staging directory and shard in progress left behind.
    killed = PartWriter(destination, run_id=run_id, part=0, attempt=0, max_shard_records=2)
    killed.extend(PARTS[0][:5])
    killed._lock.release()
    entries = [write_part(destination, run_id, 0, 1, PARTS[0]), write_part(destination, run_id, 1, 1, PARTS[1])]
    other_run = write_part(destination, new_run_id(), 0, 0, [b"another run's shard"])
    commit_parts(destination, entries, run_id=run_id)
    assert list(varstore.open(destination)) == PARTS[0] + PARTS[1]
    left = shard_files(destination) - listed_files(destination)
    assert left == {other_run[0]["name"] + suffix for suffix in (".data", ".index")}  # another run's are not ours


def test_a_dataset_is_replaced_only_with_overwrite_and_its_shards_are_removed_then(tmp_path: Path) -> None:
    destination, first_run = tmp_path / "dataset", new_run_id()
    commit_parts(destination, [write_part(destination, first_run, 0, 0, PARTS[0])], run_id=first_run)
    second_run = new_run_id()
    entries = [write_part(destination, second_run, 0, 0, PARTS[2])]
    with pytest.raises(varstore.ShardExistsError, match="overwrite=True"):
        commit_parts(destination, entries, run_id=second_run)
    assert list(varstore.open(destination)) == PARTS[0]
    commit_parts(destination, entries, run_id=second_run, overwrite=True)
    assert list(varstore.open(destination)) == PARTS[2]
    assert shard_files(destination) == listed_files(destination)
    abandon_run(destination, second_run)  # a driver failing after its commit: the committed shards stay
    assert list(varstore.open(destination)) == PARTS[2]


@pytest.mark.parametrize("tamper", ["file replaced", "entry of another part", "entry edited", "extra member"])
def test_an_entry_that_does_not_match_its_shard_is_refused_and_no_manifest_written(tmp_path: Path, tamper: str) -> None:
    destination, run_id = tmp_path / "dataset", new_run_id()
    entries = [write_part(destination, run_id, part, 0, PARTS[part]) for part in range(2)]
    if tamper == "file replaced":  # a shard of the same size whose bytes differ
        victim = destination / entries[0][0]["name"]
        twin = write_part(tmp_path / "other", run_id, 0, 0, [bytes(len(record)) for record in PARTS[0]])
        for suffix in (".data", ".index"):
            shutil.copyfile(tmp_path / "other" / (twin[0]["name"] + suffix), f"{victim}{suffix}")
    elif tamper == "entry of another part":
        entries = [entries[1], entries[0]]
    elif tamper == "entry edited":
        entries[1][0] = {**entries[1][0], "records": entries[1][0]["records"] + 1}
    else:
        entries[0][0] = {**entries[0][0], "path": "/etc/passwd"}
    with pytest.raises(varstore.FormatError):
        commit_parts(destination, entries, run_id=run_id)
    assert not (destination / "manifest.json").exists()


def test_a_driver_killed_before_its_commit_leaves_no_manifest_and_abandon_run_cleans_up(tmp_path: Path) -> None:
    destination, run_id = tmp_path / "dataset", new_run_id()
    driver = textwrap.dedent(
        f"""
        import os, sys
        from varstore.dataset.parts import PartWriter
        entries = []
        for part in range(2):
            with PartWriter({str(destination)!r}, run_id={run_id!r}, part=part, attempt=0, max_shard_records=2) as writer:
                writer.extend([b"x" * 10] * 5)
            entries.append(writer.close())
        print("written", flush=True)
        sys.stdin.read()  # the commit would follow; the test kills the driver here
        """
    )
    process = subprocess.Popen([sys.executable, "-c", driver], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None and process.stdout.readline() == "written\n"
        process.send_signal(signal.SIGKILL)
        assert process.wait(timeout=30) == -signal.SIGKILL
    finally:
        process.kill()
        process.wait(timeout=30)
    assert not (destination / "manifest.json").exists()
    assert len(shard_files(destination)) == 12
    abandon_run(destination, run_id)
    assert shard_files(destination) == set()


def test_parts_on_s3_commit_in_order_and_failed_attempts_leave_no_object(s3_server: Any, tmp_path: Path) -> None:
    options = s3_server.storage_options
    bucket = s3_server.new_bucket()
    url, run_id = f"s3://{bucket}/dataset", new_run_id()
    with pytest.raises(RuntimeError):
        with PartWriter(url, run_id=run_id, part=0, attempt=0, max_shard_records=2, storage_options=options) as failing:
            failing.extend(PARTS[0])
            raise RuntimeError("task failed")
    killed = PartWriter(url, run_id=run_id, part=1, attempt=0, max_shard_records=2, storage_options=options)
    killed.extend(PARTS[1][:3])  # one shard uploaded, then the attempt dies
    killed._lock.release()
    staging = Path(killed._directory)
    assert staging.is_dir()
    entries = [write_part(url, run_id, part, 1, PARTS[part], storage_options=options) for part in (1, 0)][::-1]
    names = commit_parts(url, entries, run_id=run_id, storage_options=options)
    assert list(varstore.open(url, storage_options=options)) == PARTS[0] + PARTS[1]
    keys = {request.key.rsplit("/", 1)[-1] for request in s3_server.requests(bucket, method="PUT")}
    assert any(key.startswith(f"part-{run_id}-000001-0-") for key in keys)  # the dead attempt did upload
    assert not staging.exists()  # this node's staging of the dead attempt is gone too
    assert object_names(url, options) == {"manifest.json"} | {name + suffix for name in names for suffix in (".data", ".index")}
    with pytest.raises(varstore.ShardExistsError):
        commit_parts(url, entries, run_id=run_id, storage_options=options)


def test_an_s3_object_replaced_after_its_task_is_refused(s3_server: Any) -> None:
    options = s3_server.storage_options
    url, run_id = f"s3://{s3_server.new_bucket()}/dataset", new_run_id()
    entries = [write_part(url, run_id, 0, 0, PARTS[0], storage_options=options)]
    other = [write_part(url, run_id, 0, 1, [bytes(len(record)) for record in PARTS[0]], storage_options=options)]
    fs, root = open_filesystem(url, options)
    for suffix in (".data", ".index"):
        fs.copy(f"{root}/{other[0][0]['name']}{suffix}", f"{root}/{entries[0][0]['name']}{suffix}")
    with pytest.raises(varstore.FormatError, match="does not match"):
        commit_parts(url, entries, run_id=run_id, storage_options=options)
    assert not fs.exists(f"{root}/manifest.json")
    abandon_run(url, run_id, storage_options=options)
    assert object_names(url, options) == set()


@pytest.mark.timeout(120)
def test_an_s3_data_object_truncated_after_its_task_is_refused_and_no_manifest_written(s3_server: Any) -> None:
    """The commit checks every data object's size against the entry its task returned: a data object cut short
    after the task (its index object untouched, so the header still agrees with the entry) is never committed
    into a manifest that every reader would then refuse."""
    options = s3_server.storage_options
    url, run_id = f"s3://{s3_server.new_bucket()}/dataset", new_run_id()
    entries = [write_part(url, run_id, 0, 0, PARTS[0], storage_options=options)]
    fs, root = open_filesystem(url, options)
    data_object = f"{root}/{entries[0][0]['name']}.data"
    fs.pipe_file(data_object, fs.cat_file(data_object)[:-1])
    with pytest.raises(varstore.FormatError, match="bytes, the entry its task returned says"):
        commit_parts(url, entries, run_id=run_id, storage_options=options)
    assert not fs.exists(f"{root}/manifest.json")

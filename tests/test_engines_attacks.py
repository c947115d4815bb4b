"""Attacks on conversion at scale (issue 13): what killed drivers, zombie attempts, empty inputs and existing
datasets leave behind or let through, at the level of `varstore.dataset.parts` and the engines' driver hooks."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

import varstore
from varstore.dataset import parts
from varstore.conversion import convert
from varstore.dataset.parts import PartWriter, commit_parts, new_run_id
from varstore.remote.filesystems import list_sizes, open_filesystem

MANIFEST = "manifest.json"


def write_part(destination: Path | str, run_id: str, part: int, attempt: int, records: list[bytes], **options: Any) -> list[dict[str, Any]]:
    with PartWriter(destination, run_id=run_id, part=part, attempt=attempt, max_shard_records=2, **options) as writer:
        writer.extend(records)
    return writer.close()


def unlisted_files(directory: Path) -> set[str]:
    """The files in `directory` that are neither the manifest, nor a shard it lists, nor the directory lock."""
    with varstore.open(directory) as dataset:
        listed = {entry.name + suffix for entry in dataset.manifest.shards for suffix in (".data", ".index")}
    return set(os.listdir(directory)) - listed - {MANIFEST, ".varstore-lock"}


def test_an_overwrite_commit_removes_the_part_shards_and_staging_a_killed_earlier_run_left(tmp_path: Path) -> None:
    """A driver killed before its manifest leaves its run's shards (and a killed worker its staging directory),
    under a run id nobody knows afterwards; an overwrite rerun must not keep them forever beside the dataset
    (a plain commit keeps other runs' shards: one may still be converting into the same destination)."""
    destination = tmp_path / "dataset"
    killed_run = new_run_id()
    write_part(destination, killed_run, 0, 0, [b"a", b"b", b"c"])
    staging = PartWriter(destination, run_id=killed_run, part=1, attempt=0, max_shard_records=2)
    staging.extend([b"d", b"e", b"f"])  # one shard published, one left in staging: the worker was SIGKILLed here
    rerun = new_run_id()
    entries = [write_part(destination, rerun, part, 0, [b"x%d" % part]) for part in range(2)]
    commit_parts(destination, entries, run_id=rerun, overwrite=True)
    assert list(varstore.open(destination)) == [b"x0", b"x1"]
    assert unlisted_files(destination) == set()


def test_an_overwrite_removes_what_a_driver_killed_after_its_manifest_left(tmp_path: Path, monkeypatch: Any) -> None:
    """A driver killed between its manifest and its cleanup leaves a failed attempt's shards listed by none;
    an overwrite rerun (another run id) must remove them with the replaced dataset's shards."""
    destination = tmp_path / "dataset"
    first = new_run_id()
    failed = write_part(destination, first, 0, 0, [b"failed attempt"])
    with monkeypatch.context() as patched:
        patched.setattr(parts, "_remove_leftovers", lambda *args, **kwargs: None)  # the driver died right after its manifest
        commit_parts(destination, [write_part(destination, first, 0, 1, [b"a"])], run_id=first)
    assert unlisted_files(destination) == {failed[0]["name"] + suffix for suffix in (".data", ".index")}
    second = new_run_id()
    commit_parts(destination, [write_part(destination, second, 0, 0, [b"a"])], run_id=second, overwrite=True)
    assert list(varstore.open(destination)) == [b"a"]
    assert unlisted_files(destination) == set()


def test_committing_no_part_into_a_new_directory_makes_an_empty_dataset(tmp_path: Path) -> None:
    """An empty Ray Dataset or Spark DataFrame runs no write task, so nothing has created the destination."""
    destination = tmp_path / "new" / "dataset"
    assert commit_parts(destination, [], run_id=new_run_id()) == []
    assert len(varstore.open(destination)) == 0


def test_ray_refuses_an_existing_dataset_when_the_write_starts_before_any_task(tmp_path: Path) -> None:
    """Without overwrite the datasink must refuse in on_write_start (on the driver, before Ray sends a task),
    not at the commit after every record was made."""
    ray_module = pytest.importorskip("varstore.ray")
    with varstore.ShardedWriter(tmp_path / "dataset", codec="str") as writer:
        writer.append("kept")
    sink = ray_module.VarstoreDatasink(tmp_path / "dataset", codec="str", column="text")
    with pytest.raises(varstore.ShardExistsError):
        sink.on_write_start()
    ray_module.VarstoreDatasink(tmp_path / "dataset", codec="str", column="text", overwrite=True).on_write_start()
    assert list(varstore.open(tmp_path / "dataset")) == ["kept"]


def test_an_overwrite_commit_at_a_url_keeps_other_runs_objects(s3_server: Any) -> None:
    """S3 has no lock: another run's manifest may land while an overwrite commit cleans up, so that cleanup must
    not remove other runs' part objects (a live dataset would then list deleted objects)."""
    options = s3_server.storage_options
    url = f"s3://{s3_server.new_bucket()}/dataset"
    other = write_part(url, new_run_id(), 0, 0, [b"another run's"], storage_options=options)
    run_id = new_run_id()
    commit_parts(url, [write_part(url, run_id, 0, 0, [b"a"], storage_options=options)], run_id=run_id,
                 overwrite=True, storage_options=options)
    fs, root = open_filesystem(url, options)
    assert {other[0]["name"] + suffix for suffix in (".data", ".index")} <= set(list_sizes(fs, root, url=url))


@pytest.mark.parametrize("bad_line", [2, 5, 9])
def test_a_bad_line_is_named_by_its_line_number_in_every_part(tmp_path: Path, bad_line: int) -> None:
    """Each part's first line number must be its own (it named the next part's: an error in any part but the
    last pointed at a line further down the file)."""
    lines = [b'{"text": "line %d"}\r\n' % number for number in range(1, 13)]
    lines[bad_line - 1] = b"{not json\r\n"
    (tmp_path / "input.jsonl").write_bytes(b"".join(lines))
    with pytest.raises(varstore.VarstoreError, match=rf"input\.jsonl, line {bad_line}: not valid JSON"):
        convert(tmp_path / "input.jsonl", tmp_path / "dataset", workers=3, field="text")


@pytest.mark.parametrize("run_id", ["*", "", "ABC", "12/..", 7])
def test_a_run_id_not_made_by_new_run_id_is_refused_before_anything_is_removed(tmp_path: Path, run_id: Any) -> None:
    """abandon_run globs this node's staging directories with the run id: "*" matched every run's."""
    live = write_part(tmp_path, new_run_id(), 0, 0, [b"a live run's"])
    with pytest.raises(varstore.VarstoreError, match="run_id must be"):
        parts.abandon_run(tmp_path, run_id)
    with pytest.raises(varstore.VarstoreError, match="run_id must be"):
        commit_parts(tmp_path, [], run_id=run_id)
    assert {live[0]["name"] + suffix for suffix in (".data", ".index")} <= set(os.listdir(tmp_path))
    assert not (tmp_path / MANIFEST).exists()


@pytest.mark.parametrize("workers", [0, -1, True, 1.0, 2.0, "2"])
def test_workers_that_are_not_a_positive_integer_are_refused(tmp_path: Path, workers: Any) -> None:
    (tmp_path / "input.txt").write_text("a\nb\n")
    with pytest.raises(varstore.VarstoreError, match="workers must be a positive integer"):
        convert(tmp_path / "input.txt", tmp_path / "dataset", workers=workers)
    assert not (tmp_path / "dataset" / MANIFEST).exists()

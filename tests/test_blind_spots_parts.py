"""varstore.dataset.parts refuses the arguments it cannot name files with: the mutants of issue 23 that passed its tests."""

from __future__ import annotations

import inspect
import os
import re
from pathlib import Path
from typing import Any

import pytest

import varstore
from varstore.dataset.parts import PartWriter, abandon_run, commit_parts, new_run_id, refuse_existing_dataset

# Each is put in file names, name prefixes and a glob pattern: not one of new_run_id()'s hex strings.
BAD_RUN_IDS = ["", "*", "ABC123", "a" * 33, "ab-cd", "../x", 12, None]


def write_part(destination: Path, run_id: str, part: int = 0, attempt: int = 0) -> list[dict[str, Any]]:
    with PartWriter(destination, run_id=run_id, part=part, attempt=attempt, max_shard_records=2) as writer:
        writer.extend([b"one", b"two", b"three"])
    return writer.close()


@pytest.mark.parametrize("run_id", BAD_RUN_IDS)
def test_a_part_writer_with_a_run_id_new_run_id_cannot_make_is_refused_before_writing(tmp_path: Path, run_id: Any) -> None:
    with pytest.raises(varstore.VarstoreError, match="run_id must be 1 to 32 lowercase hex digits"):
        PartWriter(tmp_path / "dataset", run_id=run_id, part=0, attempt=0)
    assert not (tmp_path / "dataset").exists()


def test_run_ids_of_1_and_32_hex_digits_are_accepted(tmp_path: Path) -> None:
    for run_id in ("0", "f" * 32):
        names = commit_parts(tmp_path / run_id, [write_part(tmp_path / run_id, run_id)], run_id=run_id)
        assert list(varstore.open(tmp_path / run_id)) == [b"one", b"two", b"three"]
        assert all(name.startswith(f"part-{run_id}-000000-0-") for name in names)


@pytest.mark.parametrize("run_id", BAD_RUN_IDS)
def test_a_commit_with_a_bad_run_id_is_refused_and_writes_no_manifest(tmp_path: Path, run_id: Any) -> None:
    with pytest.raises(varstore.VarstoreError, match="run_id must be 1 to 32 lowercase hex digits"):
        commit_parts(tmp_path / "dataset", [], run_id=run_id)
    assert not (tmp_path / "dataset" / "manifest.json").exists()


@pytest.mark.parametrize("run_id", BAD_RUN_IDS)
def test_abandoning_a_bad_run_id_is_refused_and_removes_nothing(tmp_path: Path, run_id: Any) -> None:
    destination = tmp_path / "dataset"
    write_part(destination, new_run_id())
    before = sorted(os.listdir(destination))
    with pytest.raises(varstore.VarstoreError, match="run_id must be 1 to 32 lowercase hex digits"):
        abandon_run(destination, run_id)
    assert sorted(os.listdir(destination)) == before


@pytest.mark.parametrize(("part", "attempt", "wrong"), [(-1, 0, "part"), (0, -1, "attempt"), (True, 0, "part"),
                                                       (0, 1.0, "attempt"), ("0", 0, "part")])
def test_a_negative_or_non_integer_part_or_attempt_is_refused(tmp_path: Path, part: Any, attempt: Any, wrong: str) -> None:
    given = part if wrong == "part" else attempt
    with pytest.raises(varstore.VarstoreError, match=re.escape(f"{wrong} must be a non-negative integer, not {given!r}")):
        PartWriter(tmp_path / "dataset", run_id=new_run_id(), part=part, attempt=attempt)
    assert not (tmp_path / "dataset").exists()


def test_part_and_attempt_zero_name_the_shards(tmp_path: Path) -> None:
    run_id = new_run_id()
    entries = write_part(tmp_path, run_id, part=0, attempt=0)
    assert [entry["name"] for entry in entries] == [f"part-{run_id}-000000-0-000000", f"part-{run_id}-000000-0-000001"]


def test_storage_options_for_a_local_commit_are_refused_and_no_manifest_is_written(tmp_path: Path) -> None:
    run_id = new_run_id()
    entries = write_part(tmp_path / "dataset", run_id)
    with pytest.raises(varstore.VarstoreError, match="storage_options apply to URLs only, and this is a local path"):
        commit_parts(tmp_path / "dataset", [entries], run_id=run_id, storage_options={"anon": True})
    assert not (tmp_path / "dataset" / "manifest.json").exists()


def test_committing_parts_that_wrote_nothing_creates_an_empty_dataset_where_no_task_made_the_directory(tmp_path: Path) -> None:
    destination = tmp_path / "never" / "written"
    assert commit_parts(destination, [[], []], run_id=new_run_id()) == []
    assert len(varstore.open(destination)) == 0


def test_a_committed_local_dataset_is_refused_before_any_task_runs_and_a_missing_one_is_not(tmp_path: Path) -> None:
    refuse_existing_dataset(tmp_path / "dataset")
    run_id = new_run_id()
    commit_parts(tmp_path / "dataset", [write_part(tmp_path / "dataset", run_id)], run_id=run_id)
    with pytest.raises(varstore.ShardExistsError, match="a dataset already exists here; pass overwrite=True"):
        refuse_existing_dataset(tmp_path / "dataset")


def test_a_part_writer_cuts_shards_where_a_sharded_writer_does_by_default() -> None:
    """The class promises the same shard boundaries for the same limits: its default limits are the writer's."""
    defaults = {name: parameter.default for name, parameter in inspect.signature(varstore.ShardedWriter).parameters.items()}
    for name in ("max_shard_bytes", "max_shard_records", "checksums", "compression_level"):
        assert inspect.signature(PartWriter).parameters[name].default == defaults[name], name

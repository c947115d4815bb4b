"""Datasets of many shards: roll-over, manifest commit, damaged or missing shards, combining shards."""

from __future__ import annotations

import json
import os
import pickle

import pytest

import varstore
from varstore.format.manifest import MANIFEST_NAME, manifest_crc32c


def write_dataset(directory, records, **options) -> None:
    with varstore.ShardedWriter(directory, **options) as writer:
        writer.extend(records)


def expected_shard_sizes(sizes: list[int], max_bytes: int) -> list[list[int]]:
    """The roll-over rule, restated: a record starts a new shard if it would take a non-empty one past the limit."""
    shards: list[list[int]] = []
    for size in sizes:
        if not shards or (shards[-1] and sum(shards[-1]) + size > max_bytes):
            shards.append([])
        shards[-1].append(size)
    return shards


def test_shards_roll_over_at_the_byte_limit_and_never_exceed_it_except_for_one_big_record(tmp_path):
    sizes = [10, 20, 70, 1, 150, 0, 99, 100, 1]
    write_dataset(tmp_path, [b"x" * size for size in sizes], max_shard_bytes=100)
    dataset = varstore.open(tmp_path)
    actual = [varstore.open(path).record_sizes().tolist() for path in dataset.shard_paths]
    assert actual == expected_shard_sizes(sizes, 100)


def test_shard_of_exactly_the_byte_limit_is_not_split(tmp_path):
    write_dataset(tmp_path, [b"x" * 50, b"y" * 50, b"z"], max_shard_bytes=100)
    assert [entry.records for entry in varstore.open(tmp_path).manifest.shards] == [2, 1]


def test_shards_roll_over_at_the_record_limit(tmp_path):
    write_dataset(tmp_path, [b"r"] * 10, max_shard_records=4)
    assert [entry.records for entry in varstore.open(tmp_path).manifest.shards] == [4, 4, 2]


def test_dataset_is_invisible_until_close_and_gone_after_an_exception(tmp_path):
    with pytest.raises(RuntimeError):
        with varstore.ShardedWriter(tmp_path / "data", max_shard_records=2) as writer:
            writer.extend([b"a", b"b", b"c"])
            assert len(writer.shard_names) == 1
            with pytest.raises(varstore.MissingFileError, match="manifest"):
                varstore.open(tmp_path / "data")
            raise RuntimeError("stop")
    assert os.listdir(tmp_path / "data") == []


def test_existing_dataset_is_kept_unless_overwrite_and_stale_shards_are_removed(tmp_path):
    write_dataset(tmp_path, [b"old"] * 6, max_shard_records=2)
    with pytest.raises(varstore.ShardExistsError):
        varstore.ShardedWriter(tmp_path)
    write_dataset(tmp_path, [b"new"] * 3, max_shard_records=2, overwrite=True)
    assert list(varstore.open(tmp_path)) == [b"new"] * 3
    listed = [entry.name for entry in varstore.open(tmp_path).manifest.shards]
    assert sorted(os.listdir(tmp_path)) == sorted(
        [MANIFEST_NAME] + [f"{name}{suffix}" for name in listed for suffix in (".data", ".index")]
    )


def test_missing_shard_file_is_refused_at_open_naming_it(tmp_path):
    write_dataset(tmp_path, [b"a", b"b"], max_shard_records=1)
    os.unlink(tmp_path / "shard-000001.data")
    with pytest.raises(varstore.MissingFileError, match=r"shard-000001\.data"):
        varstore.open(tmp_path)


def test_truncated_shard_file_is_refused_at_open_naming_it(tmp_path):
    write_dataset(tmp_path, [b"abc", b"def"], max_shard_records=1)
    os.truncate(tmp_path / "shard-000000.index", 70)
    with pytest.raises(varstore.FormatError, match=r"shard-000000\.index: shard file is 70 bytes"):
        varstore.open(tmp_path)


def test_shard_swapped_for_another_of_the_same_size_is_refused_at_open(tmp_path):
    """Spec §3.1 (1.1): every listed shard's header is checked against its entry at open, not at first read."""
    write_dataset(tmp_path, [b"abc", b"def"], max_shard_records=1)
    os.replace(tmp_path / "shard-000001.data", tmp_path / "shard-000000.data")
    os.replace(tmp_path / "shard-000001.index", tmp_path / "shard-000000.index")
    write_dataset(tmp_path / "other", [b"xyz"])
    for suffix in (".data", ".index"):
        os.link(tmp_path / "other" / f"shard-000000{suffix}", tmp_path / f"shard-000001{suffix}")
    with pytest.raises(varstore.FormatError, match="shard-000000.index: shard does not match the manifest"):
        varstore.open(tmp_path)


@pytest.mark.parametrize("name", ["../outside", "/etc/passwd", ".hidden", "a/b", ""])
def test_manifest_shard_names_must_be_plain_file_names(tmp_path, name):
    write_dataset(tmp_path, [b"a"])
    manifest = json.loads((tmp_path / MANIFEST_NAME).read_text())
    manifest["shards"][0]["name"] = name
    manifest["crc32c"] = manifest_crc32c(manifest)
    (tmp_path / MANIFEST_NAME).write_text(json.dumps(manifest))
    with pytest.raises(varstore.FormatError, match="plain file names"):
        varstore.open(tmp_path)


def test_symlinked_shard_is_refused(tmp_path):
    write_dataset(tmp_path / "real", [b"a"])
    write_dataset(tmp_path / "linked", [b"a"])
    os.unlink(tmp_path / "linked" / "shard-000000.data")
    os.symlink(tmp_path / "real" / "shard-000000.data", tmp_path / "linked" / "shard-000000.data")
    with pytest.raises(varstore.FormatError, match="not links"):
        varstore.open(tmp_path / "linked")


def test_shards_written_separately_combine_into_one_dataset_without_copying(tmp_path):
    for part in range(3):
        with varstore.Writer(tmp_path / f"part-{part}", codec="str") as writer:
            writer.extend(f"{part}-{i}" for i in range(part + 1))
    inode_before = os.stat(tmp_path / "part-1.data").st_ino
    assert varstore.write_manifest(tmp_path, metadata={"parts": 3}) == ["part-0", "part-1", "part-2"]
    dataset = varstore.open(tmp_path)
    assert list(dataset) == ["0-0", "1-0", "1-1", "2-0", "2-1", "2-2"]
    assert dataset.metadata == {"parts": 3} and dataset.codec == "str"
    dataset.verify()
    assert os.stat(tmp_path / "part-1.data").st_ino == inode_before


def test_combining_shards_of_different_codecs_is_refused(tmp_path):
    with varstore.Writer(tmp_path / "a", codec="str") as writer:
        writer.append("text")
    with varstore.Writer(tmp_path / "b") as writer:
        writer.append(b"bytes")
    with pytest.raises(varstore.FormatError, match="different codec"):
        varstore.write_manifest(tmp_path)
    assert not (tmp_path / MANIFEST_NAME).exists()


def test_shard_rewritten_after_the_manifest_with_the_same_sizes_is_refused_at_open(tmp_path):
    write_dataset(tmp_path, [b"a" * 10, b"b" * 10], max_shard_records=1)
    with varstore.Writer(tmp_path / "shard-000001", overwrite=True) as writer:
        writer.append(b"c" * 10)  # same sizes, same record count, different content
    with pytest.raises(varstore.FormatError, match="shard-000001.index: shard does not match the manifest: its data checksum"):
        varstore.open(tmp_path)


def test_empty_dataset_opens_with_no_records(tmp_path):
    write_dataset(tmp_path, [])
    dataset = varstore.open(tmp_path)
    assert len(dataset) == 0 and list(dataset) == [] and dataset.get_batch([]) == []
    with pytest.raises(varstore.RecordIndexError):
        dataset[0]


def test_dataset_pickles_by_path_and_maps_shards_only_when_read(tmp_path):
    write_dataset(tmp_path, [b"a", b"b", b"c"], max_shard_records=2)
    dataset = varstore.open(tmp_path)
    dataset[0]
    payload = pickle.dumps(dataset)
    assert len(payload) < 500
    clone = pickle.loads(payload)
    assert not clone._readers
    assert clone.get_batch([2, 0]) == [b"c", b"a"] and len(clone) == 3


def test_overwrites_never_reuse_a_shard_name(tmp_path):
    """Regression (issue 9, item 7): after two overwrites an old name held new records, which an open
    reader of the first version read silently."""
    seen: set[str] = set()
    for version in range(3):
        write_dataset(tmp_path, [bytes([version])] * 5, max_shard_records=2, overwrite=version > 0)
        names = {entry.name for entry in varstore.open(tmp_path).manifest.shards}
        assert not names & seen
        seen |= names


def test_overwrite_replaces_a_dataset_whose_manifest_is_damaged_and_keeps_unknown_files(tmp_path):
    write_dataset(tmp_path, [b"old"] * 4, max_shard_records=2)
    (tmp_path / MANIFEST_NAME).write_bytes(b'{"format": "varstore-dataset", "version": true}')
    with pytest.raises(varstore.ShardExistsError, match="damaged"):
        varstore.ShardedWriter(tmp_path)
    write_dataset(tmp_path, [b"new"] * 3, max_shard_records=2, overwrite=True)
    dataset = varstore.open(tmp_path)
    assert list(dataset) == [b"new"] * 3
    assert {entry.name for entry in dataset.manifest.shards}.isdisjoint({"shard-000000", "shard-000001"})
    assert (tmp_path / "shard-000000.index").exists(), "shards of an unreadable manifest are unknown: kept"


def test_write_manifest_replaces_a_manifest_only_when_asked(tmp_path):
    write_dataset(tmp_path, [b"a", b"b"], max_shard_records=1)
    with pytest.raises(varstore.ShardExistsError, match="overwrite=True"):
        varstore.write_manifest(tmp_path, ["shard-000000"])
    assert varstore.write_manifest(tmp_path, ["shard-000000"], overwrite=True) == ["shard-000000"]
    assert list(varstore.open(tmp_path)) == [b"a"]


def test_manifest_committed_meanwhile_is_not_clobbered(tmp_path, monkeypatch):
    """Without the directory lock (another machine), a new dataset's manifest is linked, never renamed over one."""
    writer = varstore.ShardedWriter(tmp_path / "data")
    writer.append(b"late")
    writer._lock.release()
    write_dataset(tmp_path / "data", [b"first"], overwrite=True)
    with pytest.raises(varstore.ShardExistsError, match="manifest"):
        writer.close()
    assert list(varstore.open(tmp_path / "data")) == [b"first"]


def test_sharded_writer_skips_a_shard_name_a_standalone_writer_holds(tmp_path):
    standalone = varstore.Writer(tmp_path / "shard-000000")
    standalone.append(b"mine")
    write_dataset(tmp_path, [b"a", b"b"])
    assert [entry.name for entry in varstore.open(tmp_path).manifest.shards] == ["shard-000001"]
    standalone.close()
    assert list(varstore.open(tmp_path / "shard-000000")) == [b"mine"]

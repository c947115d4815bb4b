"""A reader reads the version it opened or refuses with DatasetReplacedError: never another version's records,
after an overwrite, a chdir, a pickle round trip or a shard name reused with the same size and data checksum."""

from __future__ import annotations

import multiprocessing
import os
import pickle
import resource
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import varstore
from varstore.dataset import local_source as sharded_reader
from varstore.format.checksum import crc32c, crc32c_combine

FORK = multiprocessing.get_context("fork")
TIMEOUT = 30


def write_dataset(directory: Path, records: list[bytes], *, shard_records: int = 3) -> None:
    with varstore.ShardedWriter(directory, max_shard_records=shard_records, overwrite=True) as writer:
        writer.extend(records)


def version_records(version: int, count: int = 12) -> list[bytes]:
    return [f"v{version}-{index}".encode() for index in range(count)]


@given(st.binary(max_size=300), st.binary(max_size=300), st.integers(0, 2**32 - 1))
def test_crc32c_combine_equals_the_crc_of_the_concatenation(first, second, seed):
    assert crc32c_combine(crc32c(first), crc32c(second), len(second)) == crc32c(first + second)
    assert crc32c_combine(seed, crc32c(b""), 0) == seed


def test_crc32c_combine_of_a_long_zero_run_matches_the_direct_crc():
    zeros = bytes(1 << 20)
    assert crc32c_combine(crc32c(b"head"), crc32c(zeros), len(zeros)) == crc32c(b"head" + zeros)


def test_reader_of_a_relative_path_reopens_the_same_files_after_chdir(tmp_path, monkeypatch):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    write_dataset(tmp_path / "a" / "data", version_records(1))
    write_dataset(tmp_path / "b" / "data", version_records(2))
    with varstore.Writer(tmp_path / "a" / "shard") as writer:
        writer.extend(version_records(1))
    with varstore.Writer(tmp_path / "b" / "shard") as writer:
        writer.extend(version_records(2))
    monkeypatch.chdir(tmp_path / "a")
    dataset, shard = varstore.open("data"), varstore.open("shard")
    monkeypatch.chdir(tmp_path / "b")
    assert list(dataset) == version_records(1)  # its shards are mapped lazily, after the chdir
    assert list(pickle.loads(pickle.dumps(dataset))) == version_records(1)
    assert list(pickle.loads(pickle.dumps(shard))) == version_records(1)


def test_unpickled_reader_refuses_a_dataset_replaced_since_it_was_pickled(tmp_path):
    write_dataset(tmp_path / "data", version_records(1))
    payload = pickle.dumps(varstore.open(tmp_path / "data"))
    write_dataset(tmp_path / "data", version_records(2))
    with pytest.raises(varstore.DatasetReplacedError, match=r"data: the dataset was replaced .*opened version 0x[0-9a-f]+, now 0x[0-9a-f]+"):
        pickle.loads(payload)


def test_unpickled_shard_reader_refuses_a_shard_replaced_since_it_was_pickled(tmp_path):
    with varstore.Writer(tmp_path / "docs") as writer:
        writer.extend(version_records(1))
    payload = pickle.dumps(varstore.open(tmp_path / "docs"))
    with varstore.Writer(tmp_path / "docs", overwrite=True) as writer:
        writer.extend(version_records(2))
    with pytest.raises(varstore.DatasetReplacedError, match="docs: the shard was replaced"):
        pickle.loads(payload)


def test_shard_first_read_after_an_overwrite_raises_dataset_replaced_not_missing_file(tmp_path):
    write_dataset(tmp_path / "data", version_records(1))
    reader = varstore.open(tmp_path / "data")
    assert reader[0] == b"v1-0"  # maps shard 0 only
    write_dataset(tmp_path / "data", version_records(2))
    assert reader[1] == b"v1-1"  # a mapped shard keeps the old version
    with pytest.raises(varstore.DatasetReplacedError, match="replaced after this reader opened it"):
        reader[11]


def _shard_by_hand(directory: Path, records: list[bytes]) -> None:
    """Shard "part" of `directory` holding `records`, listed alone in a freshly written manifest."""
    with varstore.Writer(directory / "part", overwrite=True) as writer:
        writer.extend(records)
    if (directory / "manifest.json").exists():
        os.remove(directory / "manifest.json")
    varstore.write_manifest(directory, ["part"])


def test_reused_shard_name_with_equal_count_and_data_checksum_is_refused_as_replaced(tmp_path):
    # Same data bytes and record count, other record boundaries: only the index checksum tells them apart.
    (tmp_path / "data").mkdir()
    _shard_by_hand(tmp_path / "data", [b"ab", b"c"])
    reader = varstore.open(tmp_path / "data")
    _shard_by_hand(tmp_path / "data", [b"a", b"bc"])
    with pytest.raises(varstore.DatasetReplacedError):
        reader[0]


def test_shard_changed_under_an_unchanged_manifest_stays_a_format_error(tmp_path):
    (tmp_path / "data").mkdir()
    _shard_by_hand(tmp_path / "data", [b"ab", b"c"])
    reader = varstore.open(tmp_path / "data")
    with varstore.Writer(tmp_path / "data" / "part", overwrite=True) as writer:
        writer.extend([b"a", b"bc"])
    with pytest.raises(varstore.FormatError, match="index checksum"):
        reader[0]
    with pytest.raises(varstore.FormatError, match="index checksum"):
        varstore.open(tmp_path / "data")[0]


def test_fresh_open_that_races_an_overwrite_retries_against_the_new_manifest(tmp_path, monkeypatch):
    write_dataset(tmp_path / "data", version_records(1))
    read_manifest = sharded_reader.read_manifest
    calls = []

    def overwrite_after_first_read(directory: str) -> Any:
        manifest = read_manifest(directory)
        if not calls:
            write_dataset(tmp_path / "data", version_records(2))  # the old shards are gone before they are checked
        calls.append(directory)
        return manifest

    monkeypatch.setattr(sharded_reader, "read_manifest", overwrite_after_first_read)
    assert list(varstore.open(tmp_path / "data")) == version_records(2)


def test_open_leaves_the_file_descriptor_limit_unchanged(tmp_path):
    write_dataset(tmp_path / "data", version_records(1))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    lowered = min(soft, 512) if hard == resource.RLIM_INFINITY or hard > 512 else soft
    resource.setrlimit(resource.RLIMIT_NOFILE, (lowered, hard))
    try:
        reader = varstore.open(tmp_path / "data")
        assert list(reader) == version_records(1)
        assert resource.getrlimit(resource.RLIMIT_NOFILE) == (lowered, hard)
        assert reader._max_open == (lowered - 64) // 4  # sized from the soft limit as it is
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _read_after_overwrites(directory: Path, ready: Any, overwritten: Any, results: Any) -> None:
    """Open v1, map its first shard, wait for two overwrites, then read every record: v1 or a refusal each."""
    outcome: list[Any] = []
    try:
        reader = varstore.open(directory)
        outcome.append(reader[0])
        ready.send("open")
        if overwritten.poll(TIMEOUT):
            overwritten.recv()
            for index in range(len(reader)):
                try:
                    outcome.append(reader[index])
                except varstore.DatasetReplacedError:
                    outcome.append("replaced")
            outcome.append(reader.get_batch(np.arange(3)))  # the mapped shard, in one batch
    except Exception as error:  # reported to the test, which fails on it
        outcome.append(f"{type(error).__name__}: {error}")
    results.send(outcome)


def test_reader_process_reads_only_its_version_while_the_dataset_is_overwritten_twice(tmp_path):
    # v3 reuses v1's shard names with records of the same sizes (same counts, sizes and edges): only checksums differ.
    directory = tmp_path / "data"
    versions = {number: [f"v{number}-{index:02d}".encode() for index in range(12)] for number in (1, 2, 3)}
    write_dataset(directory, versions[1])
    ready_child, ready = FORK.Pipe()
    overwritten, overwritten_child = FORK.Pipe()
    results, results_child = FORK.Pipe(duplex=False)
    process = FORK.Process(target=_read_after_overwrites, args=(directory, ready_child, overwritten_child, results_child))
    process.start()
    try:
        assert ready.poll(TIMEOUT) and ready.recv() == "open"
        write_dataset(directory, versions[2])
        write_dataset(directory, versions[3])
        overwritten.send("done")
        assert results.poll(TIMEOUT)
        outcome = results.recv()
    finally:
        process.join(TIMEOUT)
        if process.is_alive():
            process.kill()
    *reads, batch = outcome
    assert batch == versions[1][:3], outcome
    assert reads[:4] == [versions[1][0]] + versions[1][:3]  # shard 0 stayed mapped
    assert reads[4:] == ["replaced"] * 9, reads

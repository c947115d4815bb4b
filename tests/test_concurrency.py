"""Readers racing a writer see the old dataset or the new one, whole, never a mix; a shard replaced by
rename leaves open readers' view intact; many threads reading one reader get the right records."""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import random
import threading
from pathlib import Path
from typing import Any

import numpy as np

import varstore

from .helpers_reliability import make_records

READERS = 3
THREADS = 8
FORK = multiprocessing.get_context("fork")


def read_whole(store: Any, method: int) -> list[bytes]:
    count = len(store)
    if method == 0:
        return list(store)
    if method == 1:
        return store.get_batch(np.arange(count))
    if method == 2:
        return store[0:count]
    return [store[index] for index in range(count)]


def reader_loop(directory: Path, versions: list[list[bytes]], start: Any, stop: Any, results: Any, tolerated: tuple) -> None:
    """Open and read the whole dataset until `stop`; report (reads per version, tolerated errors, failures)."""
    seen = [0] * len(versions)
    tolerated_errors = 0
    failures: list[str] = []
    start.wait()
    method = 0
    while not stop.is_set() and len(failures) < 3:
        method = (method + 1) % 4
        try:
            with varstore.open(directory) as store:
                records = read_whole(store, method)
        except tolerated:
            tolerated_errors += 1
            continue
        except Exception as error:  # reported to the test, which fails on it
            failures.append(f"{type(error).__name__}: {error}")
            continue
        if records in versions:
            seen[versions.index(records)] += 1
        else:
            failures.append(f"read {len(records)} records matching no version (method {method})")
    results.put((seen, tolerated_errors, failures))


def race(directory: Path, versions: list[list[bytes]], write_versions, rounds: int, tolerated: tuple = ()) -> list:
    """Run READERS reader processes while this process calls `write_versions(round)` `rounds` times."""
    start, stop, results = FORK.Barrier(READERS + 1), FORK.Event(), FORK.Queue()
    readers = [FORK.Process(target=reader_loop, args=(directory, versions, start, stop, results, tolerated))
               for _ in range(READERS)]
    for process in readers:
        process.start()
    start.wait()
    try:
        for round_number in range(rounds):
            write_versions(round_number)
    finally:
        stop.set()
        outcomes = [results.get(timeout=120) for _ in readers]
        for process in readers:
            process.join(timeout=60)
            if process.is_alive():
                process.kill()
    for seen, _, failures in outcomes:
        assert failures == []
        assert sum(seen) > 0
    return outcomes


def test_readers_see_the_old_or_the_new_manifest_while_a_shard_is_added_and_removed(memory_path):
    parts = [make_records(30 + number, 25) for number in range(4)]
    for number, records in enumerate(parts):
        with varstore.Writer(memory_path / f"part-{number}") as writer:
            writer.extend(records)
    old_names, new_names = ["part-0", "part-1", "part-2"], ["part-0", "part-1", "part-2", "part-3"]
    versions = [sum(parts[:3], []), sum(parts, [])]
    varstore.write_manifest(memory_path, old_names)
    outcomes = race(memory_path, versions, lambda round_number: varstore.write_manifest(
        memory_path, new_names if round_number % 2 == 0 else old_names, overwrite=True), rounds=300)
    assert sum(seen[0] for seen, _, _ in outcomes) > 0 and sum(seen[1] for seen, _, _ in outcomes) > 0


def twin_datasets() -> tuple[list[bytes], list[bytes]]:
    """Two datasets with the same record sizes and the same first and last 4 KiB of every shard: only a
    full checksum tells their shards apart, so a reader mixing them would not notice by itself."""
    first = [bytes([number]) * 1500 for number in range(30)]
    second = [record if number % 10 in (0, 1, 2, 7, 8, 9) else record[:1] + b"\xff" * 1499
              for number, record in enumerate(first)]
    return first, second


def test_readers_see_one_whole_dataset_while_a_sharded_writer_overwrites_it(memory_path):
    first, second = twin_datasets()
    versions = [first, second]

    def write(round_number: int) -> None:
        with varstore.ShardedWriter(memory_path, max_shard_records=10, overwrite=True) as writer:
            writer.extend(versions[round_number % 2])

    write(1)
    # A reader that opened a manifest just before a newer one committed may find its shards removed or
    # replaced: MissingFileError and DatasetReplacedError are that refusal; any other error, or records of
    # both versions, fails the test.
    race(memory_path, versions, write, rounds=60, tolerated=(varstore.MissingFileError, varstore.DatasetReplacedError))


def test_open_reader_keeps_its_view_when_its_shard_is_replaced_by_rename(tmp_path):
    old, new = make_records(40, 30), make_records(41, 30)
    with varstore.Writer(tmp_path / "docs") as writer:
        writer.extend(old)
    with varstore.open(tmp_path / "docs") as before:
        with varstore.Writer(tmp_path / "docs", overwrite=True) as writer:
            writer.extend(new)
        assert list(before) == old
        before.verify()
        with varstore.open(tmp_path / "docs") as after:
            assert list(after) == new


def test_open_dataset_reader_keeps_its_view_after_the_dataset_is_overwritten(tmp_path):
    old, new = make_records(42, 40), make_records(43, 40)
    with varstore.ShardedWriter(tmp_path, max_shard_records=10) as writer:
        writer.extend(old)
    with varstore.open(tmp_path) as before:
        assert list(before) == old  # maps every shard
        with varstore.ShardedWriter(tmp_path, max_shard_records=10, overwrite=True) as writer:
            writer.extend(new)
        assert list(before) == old
        before.verify()
        with varstore.open(tmp_path) as after:
            assert list(after) == new


def test_many_threads_reading_one_reader_get_the_right_records(tmp_path):
    records = make_records(44, 400)
    with varstore.ShardedWriter(tmp_path / "data", max_shard_records=37) as writer:
        writer.extend(records)
    with varstore.Writer(tmp_path / "docs") as writer:
        writer.extend(records)
    dataset = varstore.open(tmp_path / "data", verify_reads=True)
    dataset._max_open = 2  # shards are unmapped and remapped while other threads read them
    stores = [varstore.open(tmp_path / "docs", verify_reads=True), dataset]
    start = threading.Barrier(THREADS, timeout=60)

    def work(seed: int) -> None:
        """Raises on a wrong record or any error; the main thread re-raises it through the future."""
        generator = random.Random(seed)
        store = stores[seed % 2]
        start.wait()
        for _ in range(300):
            indices = [generator.randrange(len(records)) for _ in range(generator.randint(1, 20))]
            got = {0: lambda: [store[i] for i in indices], 1: lambda: store.get_batch(indices),
                   2: lambda: [bytes(store.get_batch_flat(indices).values)],
                   3: lambda: store[indices[0] : indices[0] + 5]}
            choice = generator.randrange(4)
            expected = {0: [records[i] for i in indices], 1: [records[i] for i in indices],
                        2: [b"".join(records[i] for i in indices)], 3: records[indices[0] : indices[0] + 5]}[choice]
            assert got[choice]() == expected, f"thread {seed}: method {choice} returned wrong records"

    try:
        with concurrent.futures.ThreadPoolExecutor(THREADS) as pool:
            for future in [pool.submit(work, seed) for seed in range(THREADS)]:
                future.result(timeout=120)
    finally:
        for store in stores:
            store.close()

"""The measurements of one peer, one step per fresh subprocess.

    python -m bench.suite STEP PEER --scale S --data DIR --result FILE [--workload NAME] [--workers N] [--variant V]

- ``build``: write every workload (timed), record the bytes on disk, check records read back.
- ``reads``: warm single and batch reads, sequential scan, verification, token windows.
- ``cold``: open and random reads of one workload right after evicting its files (a fresh process per workload).
- ``open``: open time and memory growth for one dataset size (a fresh process per size).
- ``loader``: DataLoader samples/s and PSS for one worker count (a fresh process per count).

A peer whose library does not import is reported as skipped with the reason.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import statistics
import traceback
from typing import Any, Callable

import numpy as np

from . import measure
from .peers import load
from .peers.base import Peer, Store
from .workloads import Workload, all_workloads, by_name, cached_records, same_record, touch, workloads

BUDGET = 0.6
SINGLE_READS = 20_000
BATCH = 256
BATCHES = 100
COLD_READS = 2000
COLD_BUDGET = 10.0
SCAN_BUDGET = 3.0
OPEN_REPEATS = 20
OPEN_BUDGET = 5.0
WINDOW_SEQ_LEN = 2048
WINDOW_BATCH = 8
WINDOW_BATCHES = 100
LOADER_WORKLOAD = "tokens"
LOADER_BATCH = 64
LOADER_BUDGET = 8.0
MB = 1e6


def workload_directory(data: str, peer: Peer, workload: Workload) -> str:
    return os.path.join(data, peer.name, workload.name)


def _fresh_directory(directory: str) -> None:
    shutil.rmtree(directory, ignore_errors=True)
    os.makedirs(directory)


def _timed_write(write: Callable[[str], None], directory: str, payload_bytes: int, count: int) -> dict[str, float]:
    _fresh_directory(directory)
    os.sync()  # no earlier write's dirty pages left to throttle this one's fsync
    _, seconds = measure.timed(lambda: write(directory))
    return {"write_s": seconds, "write_mb_s": payload_bytes / seconds / MB, "write_records_s": count / seconds}


def _reads_back(peer: Peer, workload: Workload, records: list[Any], directory: str) -> bool:
    store = peer.open(directory, workload)
    try:
        return len(store) == len(records) and all(
            same_record(workload, records[index], store.get(index)) for index in (0, len(records) // 2, len(records) - 1)
        )
    finally:
        store.close()


def build_workload(peer: Peer, workload: Workload, directory: str) -> dict[str, Any]:
    records = cached_records(workload)
    figures: dict[str, Any] = _timed_write(lambda target: peer.write(workload, records, target), directory,
                                           workload.payload_bytes, workload.count)
    figures["disk_bytes"] = measure.disk_bytes(directory)
    figures["payload_bytes"] = workload.payload_bytes
    figures["overhead"] = figures["disk_bytes"] / workload.payload_bytes - 1
    figures["reads_back"] = _reads_back(peer, workload, records, directory)
    write_append = getattr(peer, "write_append", None)
    if write_append is not None and workload.kind != "sample":
        append_figures = _timed_write(lambda target: write_append(workload, records, target), directory + "-append",
                                      workload.payload_bytes, workload.count)
        shutil.rmtree(directory + "-append")
        figures.update({f"{name}@append": value for name, value in append_figures.items()})
    write_flat = getattr(peer, "write_flat", None)
    if write_flat is not None and workload.kind != "sample":
        flat = workload.flat()
        flat_figures = _timed_write(lambda target: write_flat(workload, flat, target), directory + "-flat",
                                    workload.payload_bytes, workload.count)
        shutil.rmtree(directory + "-flat")
        figures.update({f"{name}@extend_flat": value for name, value in flat_figures.items()})
    return figures


def _describe(error: Exception) -> str:
    """The error's type and its last line (a DataLoader worker's error carries the whole worker traceback)."""
    lines = [line for line in str(error).splitlines() if line.strip() and line.strip() != "."]
    return f"{type(error).__name__}: {lines[-1] if lines else ''}"[:300]


def _guarded(action: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """The figures of one workload, or the error that stopped them (the other workloads still run)."""
    try:
        return action()
    except Exception as error:
        traceback.print_exc()
        return {"error": _describe(error)}


def step_build(peer: Peer, arguments: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for workload in all_workloads(arguments.scale):
        reason = peer.unsupported(workload)
        directory = workload_directory(arguments.data, peer, workload)
        results[workload.name] = {"unsupported": reason} if reason else _guarded(lambda: build_workload(peer, workload, directory))
        cached_records.cache_clear()
    return results


def _batch_variants(store: Store, workload: Workload) -> dict[str, Callable[[np.ndarray], Any]]:
    """Other batch reads a store offers: varstore's flat batch, and its list batch joined as collation would."""
    flat = getattr(store, "get_batch_flat", None)
    if flat is None or workload.kind == "sample":
        return {}
    join = np.concatenate if workload.kind == "array" else b"".join
    return {"flat": flat, "concat": lambda indices: join(store.get_batch(indices))}


def warm_figures(peer: Peer, workload: Workload, directory: str) -> dict[str, float]:
    """Single, batch and scan reads and verification with every file in the page cache."""
    measure.warm(measure.files_under(directory))
    store = peer.open(directory, workload)
    singles = workload.indices(SINGLE_READS).tolist()
    measure.run_bounded(store.get, singles, BUDGET)  # fault the pages into the maps first
    figures = {"warm_read_us": measure.seconds_per_item(store.get, singles, BUDGET) * 1e6}
    batches = [workload.indices(BATCH, stream=1 + number) for number in range(BATCHES)]
    figures["batch_read_us"] = measure.seconds_per_item(store.get_batch, batches, BUDGET) * 1e6 / BATCH
    for name, read in _batch_variants(store, workload).items():
        figures[f"batch_read_us@{name}"] = measure.seconds_per_item(read, batches, BUDGET) * 1e6 / BATCH
    count, seconds = measure.timed_iteration(store.scan(), SCAN_BUDGET)
    figures["scan_mb_s"] = float(workload.sizes()[1 : count + 1].sum()) / seconds / MB
    figures["scan_us"] = seconds / count * 1e6
    scan_flat = getattr(store, "scan_flat", None)
    if scan_flat is not None:
        records, seconds = measure.timed_flat_scan(scan_flat(), SCAN_BUDGET)
        figures["scan_mb_s@flat"] = float(workload.sizes()[:records].sum()) / seconds / MB
    checked, seconds = measure.timed(store.verify)
    if checked is not None:
        figures["verify_mb_s"] = checked / seconds / MB
    store.close()
    return figures


def cold_figures(peer: Peer, workload: Workload, directory: str) -> dict[str, float]:
    """Open, then random single reads, right after the files left the page cache.

    Bytes read from disk are the growth of the files' page-cache residency (`mincore`), which counts
    what the kernel read ahead too. Each record's bytes are touched: a zero-copy array reads nothing until then.
    """
    files = measure.files_under(directory)
    indices = workload.indices(COLD_READS, stream=999).tolist()
    figures = {}
    for advice in (None, *peer.advice_variants):
        suffix = "" if advice is None else f"@{advice}"
        gc.collect()
        measure.evict(files)
        evicted = measure.resident_bytes(files)
        figures[f"cold_left_after_evict_kb{suffix}"] = evicted / 1024
        store, open_seconds = measure.timed(lambda: peer.open(directory, workload, advice))
        opened = measure.resident_bytes(files)
        get = store.get
        done, seconds = measure.run_bounded(lambda index: touch(get(index)), indices, COLD_BUDGET)
        figures[f"cold_read_us{suffix}"] = seconds / done * 1e6
        figures[f"cold_read_kb{suffix}"] = (measure.resident_bytes(files) - opened) / done / 1024
        figures[f"cold_open_ms{suffix}"] = open_seconds * 1e3
        figures[f"cold_open_kb{suffix}"] = (opened - evicted) / 1024
        store.close()
    return figures


def window_figures(peer: Peer, directory: str) -> dict[str, float]:
    offered = peer.token_windows(directory, WINDOW_SEQ_LEN)
    if offered is None:
        return {}
    read, count = offered
    batches = [np.random.default_rng([7, number]).integers(0, count, WINDOW_BATCH) for number in range(WINDOW_BATCHES)]
    return {"windows_s": WINDOW_BATCH / measure.seconds_per_item(read, batches, BUDGET)}


def step_reads(peer: Peer, arguments: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for workload in workloads(arguments.scale):
        directory = workload_directory(arguments.data, peer, workload)
        if os.path.isdir(directory):
            results[workload.name] = _guarded(lambda: read_figures(peer, workload, directory))
    return results


def read_figures(peer: Peer, workload: Workload, directory: str) -> dict[str, float]:
    figures = warm_figures(peer, workload, directory)
    if workload.name == LOADER_WORKLOAD:
        figures.update(window_figures(peer, directory))
    return figures


def step_cold(peer: Peer, arguments: argparse.Namespace) -> dict[str, Any]:
    """Cold reads of one workload in a fresh process: no map or thread of an earlier measurement can pin pages."""
    workload = by_name(arguments.scale, arguments.workload)
    return {workload.name: cold_figures(peer, workload, workload_directory(arguments.data, peer, workload))}


def step_open(peer: Peer, arguments: argparse.Namespace) -> dict[str, Any]:
    workload = by_name(arguments.scale, arguments.workload)
    directory = workload_directory(arguments.data, peer, workload)
    measure.warm(measure.files_under(directory))
    gc.collect()
    before, anonymous_before = measure.rss_bytes(), measure.anonymous_rss_bytes()
    store, first = measure.timed(lambda: peer.open(directory, workload))
    opened, anonymous_opened = measure.rss_bytes(), measure.anonymous_rss_bytes()
    store.get(0)
    after_read = measure.rss_bytes()
    store.close()
    times: list[float] = []
    while len(times) < OPEN_REPEATS and sum(times) < OPEN_BUDGET:
        store, seconds = measure.timed(lambda: peer.open(directory, workload))
        store.close()
        times.append(seconds)
    return {workload.name: {
        "open_first_ms": first * 1e3, "open_ms": statistics.median(times) * 1e3, "records": workload.count,
        "rss_open_mb": (opened - before) / MB, "rss_anon_open_mb": (anonymous_opened - anonymous_before) / MB,
        "rss_first_read_mb": (after_read - before) / MB,
    }}


def step_loader(peer: Peer, arguments: argparse.Namespace) -> dict[str, Any]:
    from .loading import loader_figures

    workload = by_name(arguments.scale, LOADER_WORKLOAD)
    directory = workload_directory(arguments.data, peer, workload)
    figures = loader_figures(peer, workload, directory, arguments.workers, arguments.variant, LOADER_BATCH, LOADER_BUDGET)
    suffix = "" if arguments.variant == "default" else f"@{arguments.variant}"
    return {workload.name: {f"{name}{suffix}": value for name, value in figures.items()}}


STEPS = {"build": step_build, "reads": step_reads, "cold": step_cold, "open": step_open, "loader": step_loader}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("step", choices=sorted(STEPS))
    parser.add_argument("peer")
    parser.add_argument("--scale", type=float, required=True)
    parser.add_argument("--data", required=True)
    parser.add_argument("--result", required=True)
    parser.add_argument("--workload")
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--variant", default="default")
    arguments = parser.parse_args()
    try:
        peer = load(arguments.peer)
    except Exception as error:  # a peer that does not install or import is skipped, never a crash
        result: dict[str, Any] = {"skipped": f"import failed: {type(error).__name__}: {error}"}
    else:
        try:
            result = {"figures": STEPS[arguments.step](peer, arguments)}
        except Exception as error:
            traceback.print_exc()
            result = {"error": _describe(error)}
    with open(arguments.result, "w") as stream:
        json.dump(result, stream, indent=1)


if __name__ == "__main__":
    main()

"""Compression beside the peers: ``python3 tools/bench/compression.py [--out DIR] [--peers a,b] [--corpora a,b]``.

Every peer of `peers/compressed.py` stores each real corpus of `corpora.py` with its own compression; per
corpus and peer: stored size ÷ raw, write MB/s (raw bytes per second, fsync included where the library does
it), warm random read µs, batch read µs per record (256 random indices), cold random read µs and KB read from
disk per record (the files dropped from the page cache with ``posix_fadvise(DONTNEED)`` first, the growth of
their page-cache residency counted as what was read), and verify MB/s (raw bytes per second; only varstore
verifies); for each compressed varstore shard also the floor of its warm reads, python-zstandard's own
``decompress`` of the frames those reads decode, timed in the same process in rounds alternating with them. Each
peer runs in fresh subprocesses (one for write and warm reads, one for cold reads), peers one after another on
the same records. Sets up ``.venv-bench`` if needed and re-runs itself there. Writes
``compression.json`` and ``compression.md`` to DIR (default ``bench-out/``) and, for a run of every peer and
corpus, to ``tools/bench/results/`` too.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import environment  # noqa: E402

ROOT = environment.ROOT
RESULTS_DIR = ROOT / "tools" / "bench" / "results"
STEP_TIMEOUT = 1800
SEED = 20261202
SINGLE_READS = 5000
BATCH = 256
BATCHES = 40
COLD_READS = 1000
BUDGET = 0.5
COLD_BUDGET = 5.0
MB = 1e6
_LENGTH = struct.Struct("<I")
VERSIONS = ("varstore", "zstandard", "mosaicml-streaming", "litdata", "array-record", "bagz", "pylance")


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=str(ROOT / "bench-out"), help="output directory")
    parser.add_argument("--peers", help="comma-separated subset of peers (default: all)")
    parser.add_argument("--corpora", help="comma-separated subset of corpora (default: all)")
    parser.add_argument("--step", choices=("warm", "cold"), help=argparse.SUPPRESS)  # a subprocess's step
    parser.add_argument("--peer", help=argparse.SUPPRESS)
    parser.add_argument("--corpus", help=argparse.SUPPRESS)
    return parser.parse_args()


# -- corpora on disk: u32 length, then the bytes, per record (read back identically in every subprocess) --------


def _corpus_path(out: Path, corpus: str) -> Path:
    return out / "corpora" / f"{corpus}.records"


def _save_corpus(records: list[bytes], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as stream:
        for record in records:
            stream.write(_LENGTH.pack(len(record)))
            stream.write(record)


def _load_corpus(path: Path) -> list[bytes]:
    data = path.read_bytes()
    records, position = [], 0
    while position < len(data):
        (length,) = _LENGTH.unpack_from(data, position)
        records.append(data[position + 4 : position + 4 + length])
        position += 4 + length
    return records


# -- the steps, each in its own subprocess -----------------------------------------------------------------


def _indices(count: int, how_many: int, stream: int) -> np.ndarray:
    return np.random.default_rng([SEED, stream, count]).integers(0, count, how_many)


def step_warm(peer: Any, records: list[bytes], directory: str) -> dict[str, Any]:
    """Write (timed), stored bytes, a read-back check, then warm single reads (and for a compressed varstore shard
    their floor, timed in alternating rounds with them), batch reads and verification."""
    from bench import measure

    raw = sum(map(len, records))
    shutil.rmtree(directory, ignore_errors=True)
    os.makedirs(directory)
    os.sync()
    _, seconds = measure.timed(lambda: peer.write_records(records, directory))
    figures: dict[str, Any] = {"records": len(records), "raw_bytes": raw, "write_mb_s": raw / seconds / MB}
    figures["stored_bytes"] = measure.disk_bytes(directory)
    figures["stored_ratio"] = figures["stored_bytes"] / raw
    measure.warm(measure.files_under(directory))
    store = peer.open_records(directory)
    checked = _indices(len(records), 50, 1).tolist()
    if len(store) != len(records) or any(bytes(store.get(index)) != records[index] for index in checked):
        raise AssertionError(f"{peer.name} does not read back the records it stored")
    singles = _indices(len(records), SINGLE_READS, 2).tolist()
    reads = [(store.get, singles)]
    if hasattr(store, "reader"):  # varstore: what the writer chose
        figures.update(_chosen(store.reader.header))
        if figures["chosen"] != "none":
            reads.append(_read_floor(store, records, singles))
    for operation, items in reads:
        measure.run_bounded(operation, items, BUDGET)
    figures.update(zip(("warm_read_us", "zstd_decode_us"), (seconds * 1e6 for seconds in _best_alternating(reads))))
    batches = [_indices(len(records), BATCH, 3 + number) for number in range(BATCHES)]
    figures["batch_read_us"] = measure.seconds_per_item(store.get_batch, batches, BUDGET) * 1e6 / BATCH
    checked_bytes, seconds = measure.timed(store.verify)
    if checked_bytes is not None:
        figures["verify_mb_s"] = raw / seconds / MB
    store.close()
    return figures


def _chosen(header: Any) -> dict[str, Any]:
    """What a varstore writer chose for the shard whose index header is `header`."""
    from varstore.format.compression import NAMES

    return {"chosen": NAMES[header.compression], "dictionary_bytes": header.dictionary_size, "blocks": header.block_count}


def _read_floor(store: Any, records: list[bytes], singles: list[int]) -> tuple[Callable[[bytes], bytes], list[bytes]]:
    """The floor of a compressed varstore shard's reads of `singles`: python-zstandard's ``decompress`` and the
    frame each read decodes, after checking that the first frame holds its record."""
    from bench.peers.compressed import bare_decoding

    decompress, frames = bare_decoding(store, singles)
    if records[singles[0]] not in decompress(frames[0]):
        raise AssertionError(f"record {singles[0]} is not in the frame bare_decoding found for it")
    return decompress, frames


def _best_alternating(operations: list[tuple[Callable[[Any], Any], list[Any]]]) -> list[float]:
    """Each operation's best mean seconds per item over its items, in `measure.REPEATS` rounds that run every
    operation once each, so a change in the machine's load touches them alike."""
    from bench import measure

    best = [float("inf")] * len(operations)
    for _ in range(measure.REPEATS):
        for number, (operation, items) in enumerate(operations):
            done, seconds = measure.run_bounded(operation, items, BUDGET)
            best[number] = min(best[number], seconds / done)
    return best


def step_cold(peer: Any, records: list[bytes], directory: str) -> dict[str, Any]:
    """Open and random single reads right after the peer's files left the page cache."""
    from bench import measure

    files = measure.files_under(directory)
    gc.collect()
    measure.evict(files)
    evicted = measure.resident_bytes(files)
    store, open_seconds = measure.timed(lambda: peer.open_records(directory))
    opened = measure.resident_bytes(files)
    indices = _indices(len(records), COLD_READS, 99).tolist()
    done, seconds = measure.run_bounded(lambda index: bytes(store.get(index)), indices, COLD_BUDGET)
    figures = {"cold_open_ms": open_seconds * 1e3, "cold_open_kb": (opened - evicted) / 1024,
               "cold_read_us": seconds / done * 1e6, "cold_read_kb": (measure.resident_bytes(files) - opened) / done / 1024}
    store.close()
    return figures


def run_step(arguments: argparse.Namespace) -> None:
    from bench.peers.compressed import PEERS

    out = Path(arguments.out)
    peer = PEERS[arguments.peer]
    records = _load_corpus(_corpus_path(out, arguments.corpus))
    directory = str(out / "data" / arguments.peer / arguments.corpus)
    step = step_warm if arguments.step == "warm" else step_cold
    print(json.dumps(step(peer, records, directory)))


# -- the run -----------------------------------------------------------------------------------------------


def _load() -> str:
    with open("/proc/loadavg") as stream:
        return " ".join(stream.read().split()[:3])


def _subprocess(out: Path, step: str, peer: str, corpus: str) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "tools"), "PYTHONWARNINGS": "ignore"}
    command = [sys.executable, str(Path(__file__).resolve()), "--out", str(out), "--step", step, "--peer", peer,
               "--corpus", corpus]
    log = out / "logs" / f"{peer}-{corpus}-{step}.log"
    try:
        completed = subprocess.run(command, check=False, env=env, capture_output=True, text=True, timeout=STEP_TIMEOUT)
    except subprocess.TimeoutExpired:
        return {"error": f"{step} timed out after {STEP_TIMEOUT} s"}
    log.write_text(completed.stdout + completed.stderr)
    lines = completed.stdout.strip().splitlines()
    if completed.returncode or not lines:
        tail = (completed.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"{step} exited with code {completed.returncode}: {tail[:300]}"}
    return json.loads(lines[-1])


def main() -> int:
    arguments = _arguments()
    environment.run_in_bench_venv(__file__)
    if arguments.step:
        run_step(arguments)
        return 0
    from bench import corpora
    from bench.compression_report import write
    from bench.machine import _version, describe_machine
    from bench.peers.compressed import PEERS

    peers = arguments.peers.split(",") if arguments.peers else list(PEERS)
    names = arguments.corpora.split(",") if arguments.corpora else list(corpora.CORPORA)
    out = Path(arguments.out).resolve()
    (out / "logs").mkdir(parents=True, exist_ok=True)
    started, load_before = time.time(), _load()
    results: dict[str, Any] = {"corpora": {}, "figures": {}}
    for name in names:
        records = corpora.CORPORA[name]()
        _save_corpus(records, _corpus_path(out, name))
        results["corpora"][name] = {"records": len(records), "raw_bytes": sum(map(len, records)),
                                    "description": " ".join(corpora.CORPORA[name].__doc__.split("\n\n")[0].split())}
    for peer in peers:
        for name in names:
            figures = _subprocess(out, "warm", peer, name)
            if "error" not in figures:
                figures.update(_subprocess(out, "cold", peer, name))
            results["figures"].setdefault(name, {})[peer] = figures
            print(f"  {peer} {name}: {json.dumps(figures)[:200]}", flush=True)
            shutil.rmtree(out / "data" / peer / name, ignore_errors=True)
    results["meta"] = {
        **describe_machine(str(out)),
        "command": " ".join(["python3", "tools/bench/compression.py", *sys.argv[1:]]),
        "load_before": load_before, "load_after": _load(), "minutes": (time.time() - started) / 60,
        "labels": {name: PEERS[name].label for name in peers},
        "versions": {name: _version(name) for name in VERSIONS},
    }
    shutil.rmtree(out / "data", ignore_errors=True)
    destinations = [out] + ([RESULTS_DIR] if not arguments.peers and not arguments.corpora else [])
    print(write(results, destinations))
    return 0


if __name__ == "__main__":
    sys.exit(main())

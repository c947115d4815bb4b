"""Measure `Reader.verify()` beside a bare CRC32C pass over the same data file, in MB/s of payload.

    .venv/bin/python tools/bench_verify.py DIR [--codec bytes|str|msgpack|ndarray] [--records N] [--size BYTES]
                                              [--shards S --workers W]

The shard (or, with --shards, a dataset of S shards) is written once into DIR (reused when present). Rounds
alternate between the floor (the benchmark's: CRC32C of the data file through a map, 8 MiB at a time, with the
`crc32c` package), the same pass over what ``pread`` copies of the file (verify's way of reading, which a hole
of a sparse file cannot kill with SIGBUS) and verify, so load on the machine falls on all alike; each one's best time of seven
counts: CPU time (so the load of other processes does not stretch either run), or, with --shards, wall time, as
the dataset's `verify(workers=W)` runs beside `verify(workers=1)` and the floor over all its data files.
"""

from __future__ import annotations

import argparse
import glob
import mmap
import os
import time
from typing import Callable

import numpy as np
from crc32c import crc32c

import varstore
from varstore.shard.index import VERIFY_CHUNK_BYTES

FLOOR_PIECE = 8 << 20
ROUNDS = 7


def records(codec: str, count: int, size: int) -> object:
    rng = np.random.default_rng(0)
    if codec == "ndarray":
        return (np.full(size // 2, i % 65536, np.uint16) for i in range(count))
    payload = rng.integers(97, 123, size, np.uint8).tobytes()
    if codec == "bytes":
        lengths = rng.integers(max(1, size // 5), 2 * size - max(1, size // 5) + 1, count)  # mean `size`
        data = rng.bytes(int(lengths.sum()))
        ends = np.cumsum(lengths).tolist()
        return (data[end - length : end] for end, length in zip(ends, lengths.tolist()))
    if codec == "str":
        text = payload.decode("ascii")[:-2] + "é"
        return (text for _ in range(count))
    return ({"id": i, "text": payload[: size - 12].decode("ascii")} for i in range(count))


def floor(paths: list[str]) -> Callable[[], None]:
    """A bare CRC32C pass over the files, through maps (made once, as a reader's are)."""
    maps = []
    for path in paths:
        with open(path, "rb") as stream:
            maps.append(mmap.mmap(stream.fileno(), 0, access=mmap.ACCESS_READ))

    def checksum() -> None:
        for mapped in maps:
            view, value = memoryview(mapped), 0
            for start in range(0, len(view), FLOOR_PIECE):
                value = crc32c(view[start : start + FLOOR_PIECE], value)
            view.release()

    return checksum


def pread_floor(paths: list[str]) -> Callable[[], None]:
    """The same CRC32C pass over what ``pread`` copies of the files, a chunk of `VERIFY_CHUNK_BYTES` at a time into
    one buffer, as verify reads them: the floor for a reader that must not fault a map in."""
    buffer = bytearray(VERIFY_CHUNK_BYTES)
    view = memoryview(buffer)

    def checksum() -> None:
        for path in paths:
            fd = os.open(path, os.O_RDONLY)
            try:
                size, value = os.fstat(fd).st_size, 0
                for start in range(0, size, VERIFY_CHUNK_BYTES):
                    done = os.preadv(fd, [view[: min(VERIFY_CHUNK_BYTES, size - start)]], start)
                    value = crc32c(view[:done], value)
            finally:
                os.close(fd)

    return checksum


def best_times(runs: dict[str, Callable[[], None]], clock: Callable[[], float]) -> dict[str, float]:
    best = dict.fromkeys(runs, float("inf"))
    for _ in range(ROUNDS):
        for name, run in runs.items():
            started = clock()
            run()
            best[name] = min(best[name], clock() - started)
    return best


def load_average() -> str:
    with open("/proc/loadavg") as stream:
        return " ".join(stream.read().split()[:3])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory")
    parser.add_argument("--codec", default="bytes", choices=("bytes", "str", "msgpack", "ndarray"))
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=110, help="payload bytes per record (a mean, for bytes)")
    parser.add_argument("--no-checksums", action="store_true")
    parser.add_argument("--shards", type=int, default=0, help="write a dataset of this many shards instead")
    parser.add_argument("--workers", type=int, default=2, help="with --shards: the workers verify runs beside 1")
    args = parser.parse_args()
    name = f"{args.codec}-{args.records}-{args.size}-{int(not args.no_checksums)}"
    options = {"dtype": "uint16"} if args.codec == "ndarray" else {}
    print(f"load before: {load_average()}")
    if args.shards:
        path = os.path.join(args.directory, f"{name}-{args.shards}-shards")
        if not os.path.exists(os.path.join(path, "manifest.json")):
            with varstore.ShardedWriter(path, codec=args.codec, checksums=not args.no_checksums,
                                        max_shard_records=-(-args.records // args.shards), **options) as writer:
                writer.extend(records(args.codec, args.records, args.size))
        reader = varstore.open(path)
        data_paths = sorted(glob.glob(os.path.join(path, "*.data")))
        runs = {"floor": floor(data_paths), "pread + CRC32C": pread_floor(data_paths), "verify, 1 worker": reader.verify,
                f"verify, {args.workers} workers": lambda: reader.verify(workers=args.workers)}
    else:
        path = os.path.join(args.directory, name)
        if not os.path.exists(path + ".index"):
            with varstore.Writer(path, codec=args.codec, checksums=not args.no_checksums, **options) as writer:
                writer.extend(records(args.codec, args.records, args.size))
        reader = varstore.open(path)
        data_paths = [path + ".data"]
        runs = {"floor": floor(data_paths), "pread + CRC32C": pread_floor(data_paths), "verify": reader.verify}
    size = sum(os.path.getsize(data) for data in data_paths)
    # One thread: CPU time, which another process's load does not stretch; several workers: wall time.
    clock = time.perf_counter if args.shards else time.process_time
    best = best_times(runs, clock)
    print(f"{args.codec}: {len(reader)} records, {size / 1e6:.1f} MB in {len(data_paths)} data files")
    for run, seconds in best.items():
        print(f"  {run:20} {size / 1e6 / seconds:9.1f} MB/s, {best['floor'] / seconds:.2f}x the floor's speed")
    print(f"load after: {load_average()}")


if __name__ == "__main__":
    main()

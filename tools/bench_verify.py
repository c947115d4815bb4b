"""Measure `Reader.verify()` throughput in MB/s of payload on one shard of many small records.

    .venv/bin/python tools/bench_verify.py DIR [--codec bytes|str|msgpack|ndarray] [--records N] [--size BYTES]

The shard is written once into DIR (reused when present); verify runs five times and the best CPU time
counts (CPU time, not wall time, so other load on the machine does not blur a before/after comparison).
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

import varstore


def records(codec: str, count: int, size: int) -> object:
    rng = np.random.default_rng(0)
    if codec == "ndarray":
        return (np.full(size // 2, i % 65536, np.uint16) for i in range(count))
    payload = rng.integers(97, 123, size, np.uint8).tobytes()
    if codec == "bytes":
        return (payload for _ in range(count))
    if codec == "str":
        text = payload.decode("ascii")[:-2] + "é"
        return (text for _ in range(count))
    return ({"id": i, "text": payload[: size - 12].decode("ascii")} for i in range(count))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory")
    parser.add_argument("--codec", default="bytes", choices=("bytes", "str", "msgpack", "ndarray"))
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=32, help="payload bytes per record (about)")
    parser.add_argument("--no-checksums", action="store_true")
    args = parser.parse_args()
    prefix = os.path.join(args.directory, f"{args.codec}-{args.records}-{args.size}-{int(not args.no_checksums)}")
    if not os.path.exists(prefix + ".index"):
        options = {"dtype": "uint16"} if args.codec == "ndarray" else {}
        with varstore.Writer(prefix, codec=args.codec, checksums=not args.no_checksums, **options) as writer:
            writer.extend(records(args.codec, args.records, args.size))
    with varstore.open(prefix) as reader:
        size, count = reader.header.data_size, len(reader)
        best = float("inf")
        for _ in range(5):
            started = time.process_time()
            reader.verify()
            best = min(best, time.process_time() - started)
    print(f"{args.codec}: {count} records, {size / 1e6:.1f} MB, best verify {best:.3f} CPU s = {size / 1e6 / best:.1f} MB/s")


if __name__ == "__main__":
    main()

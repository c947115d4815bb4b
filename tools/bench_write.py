"""Structured writes, varstore beside the raw floor and the peers, measured side by side in one process.

    .venv-bench/bin/python tools/bench_write.py DIR [--scale S] [--rounds N] [--peers floor,varstore,lmdb,h5py]

Two workloads of dict records: the benchmark's "structured" one (tools/bench/workloads.py: a float32 array, a
label and a text; 200,000 records at scale 1) written by each peer's own `write` of tools/bench/peers (the
floor and LMDB store `pack_sample`'s msgpack, h5py three columns, varstore `Writer.extend`; each one's encoding is
inside the timing), and "captioned" (60,000 dicts at scale 1 of ~600 bytes of image bytes, a label, a float32 box
of 4 and a caption), where the floor is a plain ``msgpack.packb`` + ``f.write`` loop and fsync of the same dicts
(the box as its bytes) and varstore also runs `append` per record. Rounds alternate between the writers, so load
on the machine falls on all alike; each writer's best wall time (fsync included) counts, and MB/s are of the
workload's payload bytes as the bench counts them (the floor's encoding), so ratios are ratios of times.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Callable

import msgpack
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import varstore  # noqa: E402
from bench.peers import load  # noqa: E402
from bench.workloads import Workload  # noqa: E402


def captioned(count: int) -> list[dict[str, Any]]:
    rng = np.random.default_rng(26)
    sizes = rng.integers(500, 700, count)
    image = rng.bytes(int(sizes.sum()))
    ends = np.cumsum(sizes).tolist()
    boxes = rng.random((count, 4), dtype=np.float32)
    words = rng.integers(97, 123, count * 40, np.uint8).tobytes().decode("ascii")
    return [{"image": image[end - size : end], "label": int(label), "box": boxes[k], "caption": words[40 * k : 40 * k + 40]}
            for k, (end, size, label) in enumerate(zip(ends, sizes.tolist(), rng.integers(0, 1000, count).tolist()))]


def floor_packed(record: dict[str, Any]) -> bytes:
    return msgpack.packb({**record, "box": record["box"].tobytes()})


def floor_write(records: list[dict[str, Any]], directory: str) -> None:
    """msgpack.packb + f.write per record, the offsets after, both fsynced: the plain loop a user would write."""
    offsets = [0]
    with open(os.path.join(directory, "data"), "wb") as data:
        write = data.write
        for record in records:
            offsets.append(offsets[-1] + write(floor_packed(record)))
        data.flush()
        os.fsync(data.fileno())
    with open(os.path.join(directory, "index"), "wb") as index:
        index.write(np.asarray(offsets, np.uint64).tobytes())
        index.flush()
        os.fsync(index.fileno())


def varstore_extend(records: list[Any], directory: str) -> None:
    with varstore.Writer(os.path.join(directory, "shard"), codec="msgpack") as writer:
        writer.extend(records)


def varstore_append(records: list[Any], directory: str) -> None:
    with varstore.Writer(os.path.join(directory, "shard"), codec="msgpack") as writer:
        append = writer.append
        for record in records:
            append(record)


def peer_writer(name: str, workload: Workload) -> Callable[[list[Any], str], None]:
    """The `write` of the bench's peer `name` (tools/bench/peers), for `workload`."""
    peer = load(name)
    return lambda records, target: peer.write(workload, records, target)


def load_average() -> str:
    with open("/proc/loadavg") as stream:
        return " ".join(stream.read().split()[:3])


def writers(workload_name: str, scale: float, peers: list[str]) -> tuple[int, list[Any], dict[str, Callable[[list[Any], str], None]]]:
    """The workload's payload bytes, its records, and each writer by name."""
    if workload_name == "structured":
        workload = Workload("structured", max(200, round(200_000 * scale)), "sample")
        return workload.payload_bytes, workload.records(), {name: peer_writer(name, workload) for name in peers}
    records = captioned(max(200, round(60_000 * scale)))
    table = {"floor": floor_write, "varstore": varstore_extend, "varstore append": varstore_append}
    return sum(len(floor_packed(record)) for record in records), records, {name: table[name] for name in table
                                                                            if name.split()[0] in peers}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory")
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--peers", default="floor,varstore,lmdb,h5py")
    args = parser.parse_args()
    peers = args.peers.split(",")
    print(f"load before: {load_average()}")
    for name in ("structured", "captioned"):
        size, records, chosen = writers(name, args.scale, peers)
        best = {writer: float("inf") for writer in chosen}
        for _ in range(args.rounds):
            for writer, write in chosen.items():
                target = os.path.join(args.directory, name, writer.replace(" ", "-"))
                shutil.rmtree(target, ignore_errors=True)
                os.makedirs(target)
                os.sync()  # no earlier write's dirty pages left to throttle this one's fsync
                started = time.perf_counter()
                write(records, target)
                best[writer] = min(best[writer], time.perf_counter() - started)
                shutil.rmtree(target)
        floor = best.get("floor")
        print(f"{name}: {len(records)} records, {size / 1e6:.1f} MB")
        for writer, seconds in best.items():
            ratio = f", {floor / seconds:.2f}x the floor's speed" if floor else ""
            print(f"  {writer:16} {size / 1e6 / seconds:8.1f} MB/s{ratio}")
    print(f"load after: {load_average()}")


if __name__ == "__main__":
    main()

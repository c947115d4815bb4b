"""WebDataset tars and TFRecord files: ``varstore convert``'s MB/s beside the peer's own reading of the same files
(issue 25: the converter should be bound by reading the peer's format, not by varstore's writer).

    .venv/bin/python tools/bench/convert_streams.py [--megabytes 64] [--repeats 3] [--out bench-out/convert-streams]

Each workload's files are written once by the peer's own writer (webdataset's ShardWriter; the tfrecord
package's TFRecordWriter), then read by the peer and converted by varstore in alternating runs in this one
process (so both meet the same page cache and the same machine load), best and median of ``--repeats`` each:

- ``webdataset``: ``webdataset.WebDataset(pattern)`` iterated, no decoding, against
  ``convert(pattern, format="webdataset")`` (samples of a ~48 KB image, a class and a JSON caption);
- ``tfrecord-images``: the tfrecord package's ``tfrecord_loader`` (protobuf's parser) against ``convert(...)``
  decoding each Example (an image's ~48 KB bytes, a label, 4 floats, 16 int64 ids);
- ``tfrecord-tokens``: the same on small Examples (a 200-byte text and 256 int64 token ids each), where the
  cost is in decoding, not in bytes;
- ``tfrecord-raw``: the package's ``tfrecord_iterator`` (the framed records, no CRC checked) against
  ``convert(..., codec="bytes")`` (both CRCs checked) on the images workload.

Beside them, ``writer``: varstore's `ShardedWriter` writing the converted records, held in memory, to the same
place (the part of a conversion that is not reading the peer's format). MB/s is always the input files' bytes
over the seconds. The load average at the start and end is printed beside the
table: the figures are ratios of peers measured side by side, not absolute speeds. ``--pure-decoder`` converts
with the pure-Python Example decoder, as when protobuf is not installed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np


def _write_webdataset(folder: Path, megabytes: int) -> tuple[str, int]:
    import webdataset as wds

    folder.mkdir(parents=True)
    random = np.random.default_rng(0)
    count = megabytes * 1_000_000 // 49_000
    with wds.ShardWriter(str(folder / "shard-%03d.tar"), maxcount=max(1, count // 8), verbose=0) as sink:
        for index in range(count):
            sink.write({"__key__": f"{index:08d}", "jpg": random.bytes(48_000), "cls": index % 1000,
                        "json": {"caption": f"image {index}", "width": 640}})
    shards = sorted(os.listdir(folder))
    return str(folder / f"shard-{{000..{len(shards) - 1:03d}}}.tar"), sum(os.path.getsize(folder / n) for n in shards)


def _write_tfrecord(path: Path, megabytes: int, tokens: bool) -> tuple[str, int]:
    from tfrecord import TFRecordWriter

    random = np.random.default_rng(1)
    writer = TFRecordWriter(str(path))
    size = 2_300 if tokens else 48_300
    for index in range(megabytes * 1_000_000 // size):
        if tokens:
            writer.write({"text": (random.bytes(200), "byte"),
                          "input_ids": (random.integers(0, 50_000, 256).tolist(), "int")})
        else:
            writer.write({"image": (random.bytes(48_000), "byte"), "label": (index % 1000, "int"),
                          "box": ([0.1, 0.2, 0.7, 0.9], "float"), "ids": (list(range(index, index + 16)), "int")})
    writer.close()
    return str(path), os.path.getsize(path)


def _read_webdataset(pattern: str) -> int:
    import webdataset as wds

    return sum(1 for _ in wds.WebDataset(pattern, shardshuffle=False))


def _read_tfrecord(path: str) -> int:
    from tfrecord.reader import tfrecord_loader

    return sum(1 for _ in tfrecord_loader(path, None))


def _read_tfrecord_raw(path: str) -> int:
    from tfrecord.reader import tfrecord_iterator

    return sum(1 for _ in tfrecord_iterator(path))


def _converter(out: Path, **options: Any) -> Callable[[str], int]:
    from varstore.conversion import convert

    def run(source: str) -> int:
        return convert(source, out, overwrite=True, **options)

    return run


def _writer_only(out: Path) -> Callable[[str], int]:
    """`ShardedWriter` writing the records of the dataset at `out` (as the last conversion wrote them) from memory."""
    import varstore

    with varstore.open(out) as converted:
        records, codec = list(converted), converted.manifest.codec

    def run(source: str) -> int:
        with varstore.ShardedWriter(out.with_name("written"), codec, overwrite=True) as writer:
            writer.extend(records)
        return len(records)

    return run


def _timed(function: Callable[[str], int], source: str) -> tuple[float, int]:
    started = time.perf_counter()
    count = function(source)
    return time.perf_counter() - started, count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--megabytes", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("bench-out/convert-streams"))
    parser.add_argument("--pure-decoder", action="store_true",
                        help="decode Examples with the pure-Python decoder, not protobuf's parser (the fast path)")
    args = parser.parse_args()
    if args.pure_decoder:
        from varstore.conversion import tfrecord

        tfrecord.example_decoder = lambda: tfrecord.decode_example
    shutil.rmtree(args.out, ignore_errors=True)
    args.out.mkdir(parents=True)
    load_before = os.getloadavg()
    images = _write_tfrecord(args.out / "images.tfrecord", args.megabytes, tokens=False)
    workloads = {
        "webdataset": (_write_webdataset(args.out / "tars", args.megabytes), _read_webdataset,
                       "webdataset.WebDataset", _converter(args.out / "ds")),
        "tfrecord-images": (images, _read_tfrecord, "tfrecord_loader", _converter(args.out / "ds")),
        "tfrecord-tokens": (_write_tfrecord(args.out / "tokens.tfrecord", args.megabytes, tokens=True), _read_tfrecord,
                            "tfrecord_loader", _converter(args.out / "ds")),
        "tfrecord-raw": (images, _read_tfrecord_raw, "tfrecord_iterator", _converter(args.out / "ds", codec="bytes")),
    }
    results = []
    for name, ((source, size), peer, peer_name, convert) in workloads.items():
        runs: dict[str, list[float]] = {"peer": [], "varstore": [], "writer": []}
        roles: list[tuple[str, Callable[[str], int]]] = [("peer", peer), ("varstore", convert)]
        for repeat in range(args.repeats):  # alternating, so all meet the same load
            for role, function in roles:
                seconds, count = _timed(function, source)
                runs[role].append(seconds)
            if repeat == 0:
                roles.append(("writer", _writer_only(args.out / "ds")))
                runs["writer"].append(_timed(roles[-1][1], source)[0])
        row = {"workload": name, "megabytes": size / 1e6, "records": count, "peer": peer_name,
               **{f"{role}_best_mb_s": size / 1e6 / min(times) for role, times in runs.items()},
               **{f"{role}_median_mb_s": size / 1e6 / statistics.median(times) for role, times in runs.items()}}
        row["ratio_best"] = row["varstore_best_mb_s"] / row["peer_best_mb_s"]
        results.append(row)
        print(f"{name:16} {size / 1e6:7.1f} MB  {peer_name:22} best {row['peer_best_mb_s']:7.1f} MB/s  "
              f"varstore convert best {row['varstore_best_mb_s']:7.1f} MB/s  (ratio {row['ratio_best']:.2f}; medians "
              f"{row['peer_median_mb_s']:.1f} / {row['varstore_median_mb_s']:.1f})  writer alone best "
              f"{row['writer_best_mb_s']:.1f} MB/s", flush=True)
    load_after = os.getloadavg()
    print(f"load average (1, 5, 15 min): {load_before} at the start, {load_after} at the end; {os.cpu_count()} cores")
    (args.out / "results.json").write_text(json.dumps({"results": results, "load_before": load_before,
                                                       "load_after": load_after}, indent=2))


if __name__ == "__main__":
    main()

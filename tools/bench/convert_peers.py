"""Converters from peers' formats beside the peers' own readers: MB/s of the same files (issue 25).

    .venv-bench/bin/python tools/bench/convert_peers.py [--samples 20000] [--repeats 3] [--out bench-out/convert_peers]

Each peer writes one dataset of ``--samples`` samples ``{"text": 200-700 bytes of text, "tokens": 64-320 int32}``
with its own writer (datasets' ``save_to_disk``, MosaicML's ``MDSWriter``, litdata's ``BinaryWriter``), and then,
alternating, ``--repeats`` times each: the peer reads every sample back through its own reader (``Dataset.iter``
in numpy batches and row by row; MDS's ``MDSReader.decode_sample``, one per sample, as its StreamingDataset
decodes; litdata's ``StreamingDataset`` indexed sample by sample), and varstore's ``convert`` (``workers=1``)
writes the dataset from those files. MB/s is the files' size on disk over the seconds; the table gives the best
and median run of each and the converter's median as a share of the peer reader's median. The load averages
before and after are printed: on a busy machine only the ratios of runs side by side mean anything.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

from make_peer_fixtures import mds_writer  # the writer without streaming/__init__ (which needs torchvision)

from varstore.conversion import convert


def samples(count: int) -> list[dict[str, Any]]:
    generator = np.random.default_rng(25)
    words = [f"word{i}" for i in range(500)]
    out = []
    for _ in range(count):
        text = " ".join(generator.choice(words, int(generator.integers(30, 100))))
        out.append({"text": text, "tokens": generator.integers(0, 50000, int(generator.integers(64, 320))).astype(np.int32)})
    return out


def folder_bytes(path: Path) -> int:
    return sum(file.stat().st_size for file in path.rglob("*") if file.is_file())


def write_peers(data: list[dict[str, Any]], out: Path) -> dict[str, Path]:
    import datasets
    from litdata.streaming.writer import BinaryWriter

    datasets.disable_progress_bars()
    folders = {name: out / name for name in ("huggingface", "mds", "litdata")}
    for folder in folders.values():
        shutil.rmtree(folder, ignore_errors=True)
    features = datasets.Features({"text": datasets.Value("string"), "tokens": datasets.Sequence(datasets.Value("int32"))})
    datasets.Dataset.from_dict({"text": [s["text"] for s in data], "tokens": [s["tokens"] for s in data]},
                               features=features).save_to_disk(str(folders["huggingface"]), num_shards=4)
    with mds_writer()(columns={"text": "str", "tokens": "ndarray:int32"}, out=str(folders["mds"]), size_limit=1 << 24) as writer:
        for sample in data:
            writer.write(sample)
    writer = BinaryWriter(str(folders["litdata"]), chunk_bytes=1 << 24)
    for index, sample in enumerate(data):
        writer[index] = sample
    writer.done()
    writer.merge()
    return folders


def hf_batches(folder: Path) -> int:
    import datasets

    return sum(len(batch["text"]) for batch in datasets.load_from_disk(str(folder)).with_format("numpy").iter(1024))


def hf_rows(folder: Path) -> int:
    import datasets

    return sum(1 for _ in datasets.load_from_disk(str(folder)))


def mds_read(folder: Path) -> int:
    from streaming.base.format.mds.reader import MDSReader

    count = 0
    for entry in json.loads((folder / "index.json").read_text())["shards"]:
        shard = MDSReader.from_json(str(folder), "", entry)
        for index in range(shard.samples):
            shard.decode_sample(shard.get_sample_data(index))
            count += 1
    return count


def litdata_read(folder: Path) -> int:
    from litdata import StreamingDataset

    dataset = StreamingDataset(str(folder))
    for index in range(len(dataset)):
        dataset[index]
    return len(dataset)


def timed(run: Callable[[], int]) -> tuple[float, int]:
    started = time.perf_counter()
    count = run()
    return time.perf_counter() - started, count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=20000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=ROOT / "bench-out" / "convert_peers")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    print(f"load average before: {os.getloadavg()}")
    folders = write_peers(samples(args.samples), args.out)
    readers = {"huggingface": {"datasets iter(1024) numpy": hf_batches, "datasets rows": hf_rows},
               "mds": {"MDSReader.decode_sample": mds_read}, "litdata": {"StreamingDataset[i]": litdata_read}}
    rows = []
    for name, folder in folders.items():
        size = folder_bytes(folder)
        runs: dict[str, list[float]] = {label: [] for label in [*readers[name], "varstore convert"]}
        destination = args.out / f"{name}-varstore"
        for _ in range(args.repeats):
            for label, read in readers[name].items():
                seconds, count = timed(partial(read, folder))
                assert count == args.samples, (label, count)
                runs[label].append(seconds)
            seconds, count = timed(partial(convert, folder, destination, format=name, overwrite=True))
            assert count == args.samples
            runs["varstore convert"].append(seconds)
        converter = statistics.median(runs["varstore convert"])
        for label, times in runs.items():
            median = statistics.median(times)
            rows.append({"format": name, "MB": round(size / 1e6, 1), "run": label,
                         "best MB/s": round(size / 1e6 / min(times), 1), "median MB/s": round(size / 1e6 / median, 1),
                         "convert / this": round(median / converter, 2)})
    print(f"load average after: {os.getloadavg()}")
    print("| format | MB | run | best MB/s | median MB/s | convert speed / this |")
    print("|---|---:|---|---:|---:|---:|")
    for row in rows:
        print(f"| {row['format']} | {row['MB']} | {row['run']} | {row['best MB/s']} | {row['median MB/s']} | "
              f"{row['convert / this']} |")
    (args.out / "results.json").write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()

"""Mini-block sizing for issue 24: ``python3 tools/bench/compression_blocks.py [--corpora a,b] [--targets 8192,16384]``.

Before a format stores them, measures zstd frames of consecutive whole records ("mini-blocks": a frame closes once
its records reach the target decoded size) on the real small-record corpora of `corpora.py`, beside two figures
of the same run: the whole corpus as one zstd-3 frame (what shard-level compression, MDS's and litdata's, can
reach) and varstore's shipping modes (`Writer(compression="zstd" | "zstd-dict")`, their files' bytes). Per
corpus, target, level and dictionary: stored bytes (frames plus the index a block shard would need: u64 record
offsets in decoded space, u64 frame offsets, u64 first records, u32 frame CRC32Cs) ÷ the one-frame figure; an estimate of a block writer's speed ÷
an uncompressed varstore write of the same records (the uncompressed write's seconds plus the frames' compression
seconds, on one thread and on all cores); and a warm random
read's µs (decode one frame and slice the record) ÷ a warm read of varstore's zstd shard. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import zstandard

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import varstore  # noqa: E402
from bench import corpora  # noqa: E402

READS = 3000
SEED = 20261202


def _frames(records: list[bytes], target: int) -> list[tuple[int, int]]:
    """(first, end) record ranges of the frames: a frame closes once its records reach `target` bytes."""
    frames, first, size = [], 0, 0
    for i, record in enumerate(records):
        size += len(record)
        if size >= target:
            frames.append((first, i + 1))
            first, size = i + 1, 0
    if first < len(records):
        frames.append((first, len(records)))
    return frames


def _seconds(action) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def _varstore_shard(records: list[bytes], directory: str, compression: str | None) -> tuple[float, int, str]:
    """Seconds to write `records` as one shard, its stored bytes and its path."""
    path = os.path.join(directory, f"shard-{compression}")

    def write() -> None:
        with varstore.Writer(path, codec="bytes", compression=compression, overwrite=True) as writer:
            for record in records:
                writer.append(record)

    seconds = _seconds(write)
    return seconds, os.path.getsize(path + ".data") + os.path.getsize(path + ".index"), path


def _warm_read_us(read, count: int) -> float:
    indices = np.random.default_rng(SEED).integers(0, count, READS).tolist()
    for i in indices[:200]:
        read(i)
    return _seconds(lambda: [read(i) for i in indices]) / READS * 1e6


def measure(name: str, records: list[bytes], targets: list[int], levels: list[int]) -> list[str]:
    raw = sum(map(len, records))
    whole = len(zstandard.ZstdCompressor(level=3).compress(b"".join(records)))
    rows = [f"\n**{name}**: {len(records):,} records, {raw:,} B raw; the whole corpus as one zstd-3 frame: {whole:,} B\n"]
    with tempfile.TemporaryDirectory() as directory:
        plain_seconds, _, _ = _varstore_shard(records, directory, None)
        for mode in ("zstd", "zstd-dict"):
            seconds, stored, path = _varstore_shard(records, directory, mode)
            reader = varstore.Reader(path)
            read_us = _warm_read_us(reader.__getitem__, len(records))
            if mode == "zstd":
                zstd_read_us = read_us
            rows.append(f"- varstore {mode} today: {stored / whole:.2f}× one frame, write {plain_seconds / seconds:.2f}× "
                        f"uncompressed, warm read {read_us:.1f} µs")
    rows.append("\n| target | level | dictionary | stored ÷ one frame | write ÷ uncompressed (1 thread, all cores) "
                "| warm read µs (÷ varstore zstd) |\n|---:|---:|---|---:|---:|---:|")
    for target in targets:
        frames = _frames(records, target)
        blocks = [b"".join(records[first:end]) for first, end in frames]
        index = 8 * (len(records) + 1) + 16 * (len(frames) + 1) + 4 * len(frames)
        for level in levels:
            for dictionary in (None, zstandard.train_dictionary(max(1024, min(110 << 10, raw // 50)), records[:16384])):
                compressor = zstandard.ZstdCompressor(level=level, dict_data=dictionary, write_content_size=True)
                stored = sum(len(compressor.compress(block)) for block in blocks)
                one = _seconds(lambda: [compressor.compress(block) for block in blocks])
                many = _seconds(lambda: compressor.multi_compress_to_buffer(blocks, threads=-1))
                decompressor = zstandard.ZstdDecompressor(dict_data=dictionary)
                frames_stored = [compressor.compress(block) for block in blocks]
                starts = np.array([first for first, _ in frames])
                ends = np.cumsum([0, *map(len, records)])

                def read(i: int) -> bytes:
                    k = int(np.searchsorted(starts, i, "right")) - 1
                    block = decompressor.decompress(frames_stored[k])
                    base = ends[frames[k][0]]
                    return block[ends[i] - base : ends[i + 1] - base]

                read_us = _warm_read_us(read, len(records))
                extra = 0 if dictionary is None else len(dictionary.as_bytes())
                rows.append(f"| {target} | {level} | {'trained' if dictionary else 'none'} | "
                            f"{(stored + index + extra) / whole:.2f} | {plain_seconds / (plain_seconds + one):.2f}, "
                            f"{plain_seconds / (plain_seconds + many):.2f} | {read_us:.1f} ({read_us / zstd_read_us:.2f}) |")
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpora", default="docstrings,metadata,manpages")
    parser.add_argument("--targets", default="8192,16384,32768")
    parser.add_argument("--levels", default="3")
    arguments = parser.parse_args()
    with open("/proc/loadavg") as stream:
        print(f"load average before: {' '.join(stream.read().split()[:3])}")
    for name in arguments.corpora.split(","):
        rows = measure(name, getattr(corpora, name)(), [int(t) for t in arguments.targets.split(",")],
                       [int(level) for level in arguments.levels.split(",")])
        print("\n".join(rows), flush=True)
    with open("/proc/loadavg") as stream:
        print(f"\nload average after: {' '.join(stream.read().split()[:3])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Conversion throughput: `varstore.spark.write_dataframe` in Spark local mode next to the serial `ShardedWriter`,
on the same Parquet input (one binary column of ~100 MB of records, 100 to 900 bytes each).

    .venv/bin/python tools/bench/spark_convert.py [--megabytes 100] [--cores 2] [--out DIR]

The serial writer reads the Parquet file with pyarrow and extends a `ShardedWriter` batch by batch (the
same Python objects per record as a Spark task's `mapInPandas` batches give). Spark reads the same files
(`--files` of them, one partition each) and writes with `write_dataframe`; its run is timed twice in one
session (the first includes starting Python workers), session start-up separately. Each output is checked:
record count, payload bytes and the sum of the records' CRC32s. Prints one line per measurement.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
import zlib

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import varstore

SHARD_BYTES = 64 << 20


def make_input(directory: str, megabytes: int, files: int) -> tuple[int, int, int]:
    """Write `files` Parquet files of random records; returns (records, payload bytes, CRC32 sum)."""
    generator = np.random.default_rng(13)
    count = megabytes * (1 << 20) // 500
    lengths = generator.integers(100, 901, size=count)
    blob = generator.integers(32, 127, size=int(lengths.sum()), dtype=np.uint8).tobytes()  # text-like bytes
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    records = [blob[offsets[k] : offsets[k + 1]] for k in range(count)]
    for number, chunk in enumerate(np.array_split(np.arange(count), files)):
        table = pa.table({"id": pa.array(chunk), "payload": pa.array([records[k] for k in chunk], pa.binary())})
        pq.write_table(table, os.path.join(directory, f"input-{number:03d}.parquet"), row_group_size=16384)
    return count, len(blob), sum(zlib.crc32(record) for record in records)


def summary(path: str) -> tuple[int, int, int]:
    reader = varstore.open(path)
    records = list(reader)
    return len(records), sum(map(len, records)), sum(zlib.crc32(record) for record in records)


def report(name: str, seconds: float, expected: tuple[int, int, int], found: tuple[int, int, int]) -> None:
    count, size, _ = expected
    status = "ok" if found == expected else f"MISMATCH {found} != {expected}"
    print(f"{name:<28} {seconds:7.2f} s {size / seconds / 1e6:8.1f} MB/s {count / seconds:10.0f} records/s  {status}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megabytes", type=int, default=100)
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--out", default=None, help="where outputs go (default: a temporary directory)")
    options = parser.parse_args()
    root = tempfile.mkdtemp(prefix="varstore-spark-bench-", dir=options.out)
    try:
        source = os.path.join(root, "input")
        os.makedirs(source)
        expected = make_input(source, options.megabytes, options.files)
        print(f"input: {expected[0]} records, {expected[1] / 1e6:.1f} MB, {options.files} Parquet files; "
              f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs", flush=True)

        start = time.perf_counter()
        with varstore.ShardedWriter(os.path.join(root, "serial"), max_shard_bytes=SHARD_BYTES) as writer:
            for name in sorted(os.listdir(source)):
                for batch in pq.ParquetFile(os.path.join(source, name)).iter_batches(columns=["payload"]):
                    writer.extend(batch.column(0).to_pylist())
        report("serial ShardedWriter", time.perf_counter() - start, expected, summary(os.path.join(root, "serial")))

        os.environ["PYSPARK_PYTHON"] = sys.executable
        from pyspark.sql import SparkSession

        from varstore.spark import write_dataframe

        start = time.perf_counter()
        spark = (
            SparkSession.builder.master(f"local[{options.cores}]")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.files.maxPartitionBytes", str(2 * options.megabytes * (1 << 20) // options.files))
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
        print(f"spark session start-up       {time.perf_counter() - start:7.2f} s", flush=True)
        try:
            for run in ("first", "second"):
                destination = os.path.join(root, f"spark-{run}")
                start = time.perf_counter()
                frame = spark.read.parquet(source)
                write_dataframe(frame, destination, column="payload", max_shard_bytes=SHARD_BYTES)
                seconds = time.perf_counter() - start
                report(f"spark local[{options.cores}] ({run} run)", seconds, expected, summary(destination))
        finally:
            spark.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()

"""Scale runs too big for the test suite; prints what it measured and exits 1 if any check fails.

1. 10 million tiny records (0 to 2 bytes) through Writer.extend_flat: write, open, verify, reads.
2. The Writer itself writing a 4.5 GiB data file whose first record is 4.5 GiB - 16 bytes of zeros
   (from a sparse map, so nothing is allocated to build it): the last record lies past 4 GiB, the first
   is over 2 GiB and is read back whole (a real 4.5 GiB copy), then the whole shard is verified.

    .venv/bin/python tools/stress_scale.py [--directory /tmp]    # needs ~5 GiB of disk, ~10 GiB of RAM
"""

from __future__ import annotations

import argparse
import mmap
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import varstore


def timed(label: str, action):
    started = time.perf_counter()
    result = action()
    print(f"{label}: {time.perf_counter() - started:.2f} s")
    return result


def tiny_records(directory: Path) -> None:
    count = 10_000_000
    lengths = np.arange(count, dtype=np.int64) % 3
    values = (np.arange(int(lengths.sum())) % 251).astype(np.uint8)
    ends = np.cumsum(lengths)

    def write() -> None:
        with varstore.Writer(directory / "tiny") as writer:
            writer.extend_flat(values, lengths)

    timed("write 10M tiny records (extend_flat)", write)
    store = timed("open", lambda: varstore.open(directory / "tiny"))
    assert len(store) == count
    timed("verify", store.verify)
    generator = np.random.default_rng(0)
    picks = generator.integers(0, count, 100_000)

    def single_reads() -> None:
        for index in picks.tolist():
            assert store[index] == values[ends[index] - lengths[index] : ends[index]].tobytes()

    timed("100k checked random single reads", single_reads)
    flat = timed("get_batch_flat of all 10M", lambda: store.get_batch_flat(np.arange(count)))
    assert np.array_equal(flat.values, values) and np.array_equal(np.diff(flat.offsets), lengths)
    store.close()


def huge_records(directory: Path) -> None:
    size = (9 << 29) - 16  # 4.5 GiB - 16
    tail = b"sixteen bytes!!!"
    source = directory / "zeros"
    with open(source, "wb") as file:
        file.truncate(size)
    with open(source, "rb") as file, mmap.mmap(file.fileno(), size, access=mmap.ACCESS_READ) as zeros:
        def write() -> None:
            with varstore.Writer(directory / "huge") as writer:
                writer.append(memoryview(zeros))
                writer.append(tail)

        timed("write a 4.5 GiB record and one past 4 GiB", write)
    source.unlink()
    with varstore.open(directory / "huge", verify_reads=True) as store:
        assert store.offsets.tolist() == [0, size, size + len(tail)]
        assert timed("read the record past 4 GiB (checked)", lambda: store[1]) == tail
        first = timed("read the 4.5 GiB record whole (a copy)", lambda: store[0])
        assert len(first) == size and first.count(0) == size
        del first
        timed("verify 4.5 GiB", store.verify)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--directory", default=tempfile.gettempdir(), help="where to write (a real disk)")
    directory = Path(tempfile.mkdtemp(prefix="varstore-scale-", dir=parser.parse_args().directory))
    try:
        tiny_records(directory)
        huge_records(directory)
    except AssertionError as failure:
        print(f"FAILED: {failure!r}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    print(f"peak RSS: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())

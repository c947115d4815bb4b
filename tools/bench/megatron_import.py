"""Megatron import cost (issue 25): `import_megatron` of a ~1 GB ``.bin`` with 1M documents beside
``varstore convert`` of the same tokens (an ``.npy`` split by ``--offsets``), seconds and bytes read.

    .venv/bin/python tools/bench/megatron_import.py [--documents 1000000] [--out bench-out/megatron] [--repeats 2]

The corpus is uint16 token ids, document lengths uniform in [1, 1073] (mean 537: ~1.07 GB), one sequence a
document, written in Megatron's ``.idx`` layout by this script; the same tokens are written as ``tokens.npy``
with ``offsets.npy`` for ``convert``. Each run is a fresh process, timed from the call to its return, with
``/proc/self/io`` before and after: ``read_bytes`` is what the process made the kernel read from the device, so
the inputs are first evicted from the page cache (fsync, then ``POSIX_FADV_DONTNEED`` on each input file) for
the cold runs; a warm run follows each cold one. Runs, alternating, ``--repeats`` rounds:

- ``index only``: `read_megatron_index`, what an import reads and checks before it writes anything;
- ``import``: `import_megatron`, which reads the ``.idx`` and the ``.bin``'s first and last 4 KiB only (the
  shard says its data CRC32C is not recorded, spec §1.2);
- ``import --data-crc``: reads the ``.bin`` once more, for the header's data CRC32C;
- ``import --checksums``: that pass also computes each record's CRC32C;
- ``convert``: `varstore.conversion.convert(tokens.npy, offsets=offsets.npy)`, which copies the tokens.

Then both datasets are compared record for record (sizes and bytes), and 2,000 random sequences of the import
against megatron-core's own `IndexedDataset` when it is importable. Writes ``results.json`` and ``results.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np

CHILD = r"""
import json, sys, time
def io():
    return dict(line.split(": ") for line in open("/proc/self/io").read().splitlines())
kind, work = sys.argv[1], sys.argv[2]
from varstore.conversion import convert, import_megatron
from varstore.conversion.megatron import read_megatron_index
import os
before, start = io(), time.perf_counter()
if kind == "index only":
    read_megatron_index(work + "/corpus.idx", os.path.getsize(work + "/corpus.bin"))
elif kind == "import":
    import_megatron(work + "/corpus", work + "/imported")
elif kind == "import --data-crc":
    import_megatron(work + "/corpus", work + "/imported", data_crc=True)
elif kind == "import --checksums":
    import_megatron(work + "/corpus", work + "/imported", checksums=True)
else:
    convert(work + "/tokens.npy", work + "/converted", offsets=work + "/offsets.npy")
seconds, after = time.perf_counter() - start, io()
print(json.dumps({"seconds": seconds, **{key: int(after[key]) - int(before[key]) for key in ("read_bytes", "rchar", "write_bytes")}}))
"""

CHECK = r"""
import sys
import numpy as np
import varstore
work = sys.argv[1]
with varstore.open(work + "/imported") as imported, varstore.open(work + "/converted") as converted:
    assert len(imported) == len(converted)
    assert np.array_equal(imported.record_sizes(), converted.record_sizes())
    tokens = imported.shard(0).as_array()
    position = 0
    for index in range(len(converted.shard_paths)):
        part = converted.shard(index).as_array()
        assert np.array_equal(tokens[position:position + len(part)], part)
        position += len(part)
    assert position == len(tokens)
    try:
        import warnings
        warnings.simplefilter("ignore")
        from megatron.core.datasets.indexed_dataset import IndexedDataset
    except ImportError:
        print("megatron-core not importable: not compared")
    else:
        megatron = IndexedDataset(work + "/corpus")
        assert len(megatron) == len(imported)
        for index in np.random.default_rng(1).integers(0, len(imported), 2000).tolist():
            assert megatron[index].tobytes() == imported[index].tobytes()
        print("megatron-core IndexedDataset: 2000 random sequences equal")
print("import and convert: every record equal")
"""

KINDS = ("index only", "import", "import --data-crc", "import --checksums", "convert")


def build(work: Path, documents: int) -> dict[str, int]:
    """corpus.bin/.idx (Megatron's layout) and tokens.npy/offsets.npy of the same tokens."""
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 1074, documents).astype(np.int32)
    ends = np.cumsum(lengths, dtype=np.int64)
    total = int(ends[-1])
    tokens = np.lib.format.open_memmap(work / "tokens.npy", "w+", np.uint16, (total,))
    step = 1 << 26
    for start in range(0, total, step):
        tokens[start:start + step] = rng.integers(0, 50257, min(step, total - start), dtype=np.uint16)
    tokens.flush()
    with open(work / "corpus.bin", "wb") as file:
        for start in range(0, total, step):
            file.write(tokens[start:start + step].tobytes())
    del tokens
    np.save(work / "offsets.npy", np.concatenate(([0], ends)))
    pointers = np.concatenate(([0], ends[:-1])) * 2
    with open(work / "corpus.idx", "wb") as file:
        file.write(b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 8, documents, documents + 1))
        file.write(lengths.astype("<i4").tobytes() + pointers.astype("<i8").tobytes())
        file.write(np.arange(documents + 1, dtype="<i8").tobytes())
    return {"tokens": total, "bin_bytes": total * 2, "idx_bytes": os.path.getsize(work / "corpus.idx")}


def evict(work: Path) -> None:
    for name in ("corpus.bin", "corpus.idx", "tokens.npy", "offsets.npy"):
        descriptor = os.open(work / name, os.O_RDONLY)
        try:
            os.fsync(descriptor)
            os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(descriptor)


def run(kind: str, work: Path) -> dict[str, float]:
    for name in ("imported", "converted"):
        shutil.rmtree(work / name, ignore_errors=True)
    done = subprocess.run([sys.executable, "-c", CHILD, kind, str(work)], capture_output=True, text=True, check=True,
                          timeout=3600)
    return json.loads(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--documents", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("bench-out/megatron"))
    args = parser.parse_args()
    work = args.out / "work"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    corpus = build(work, args.documents)
    rows: list[dict] = []
    load = [os.getloadavg()[0]]
    for round_ in range(args.repeats):
        for kind in KINDS:
            for cache in ("cold", "warm"):
                if cache == "cold":
                    evict(work)
                rows.append({"kind": kind, "cache": cache, "round": round_, **run(kind, work)})
                print(json.dumps(rows[-1]), flush=True)
        load.append(os.getloadavg()[0])
    # The last run was a convert, which left its dataset: import beside it, then compare the two.
    importing = "import sys; from varstore.conversion import import_megatron as m; m(sys.argv[1] + '/corpus', sys.argv[1] + '/imported')"
    subprocess.run([sys.executable, "-c", importing, str(work)], check=True, timeout=3600)
    checked = subprocess.run([sys.executable, "-c", CHECK, str(work)], capture_output=True, text=True, check=True,
                             timeout=3600).stdout.strip()
    results = {"corpus": corpus, "runs": rows, "check": checked, "load_1min": load}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=1))
    summary = (f"corpus: {args.documents} documents, {corpus['tokens']} uint16 tokens, .bin {corpus['bin_bytes']} bytes, "
               f".idx {corpus['idx_bytes']} bytes; 1-minute load average {', '.join(f'{x:.1f}' for x in load)}")
    lines = [summary, "",
             "| run | cache | best s | read_bytes (device) | rchar (read calls) | write_bytes |", "| --- | --- | --- | --- | --- | --- |"]
    for kind in KINDS:
        for cache in ("cold", "warm"):
            mine = [row for row in rows if row["kind"] == kind and row["cache"] == cache]
            best = min(mine, key=lambda row: row["seconds"])
            lines.append(f"| {kind} | {cache} | {best['seconds']:.2f} | {best['read_bytes']:,} | {best['rchar']:,} | "
                         f"{best['write_bytes']:,} |")
    lines += ["", checked]
    (args.out / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    shutil.rmtree(work)


if __name__ == "__main__":
    main()

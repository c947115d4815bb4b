"""The demo: write a sample dataset, read it at random, verify it and show one record.

Run through the README's first command (``python3 tools/run.py demo``); it writes
into ``demo-out/`` and replaces what an earlier run left there. It needs only varstore's
base dependencies (numpy, msgpack, crc32c): no torch, no extras.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import varstore  # noqa: E402
from varstore.format.notation import to_json

OUT = Path(__file__).resolve().parent.parent / "demo-out"
SAMPLES = 20_000
DOCUMENTS = 50_000


def write_samples(rng: np.random.Generator) -> None:
    """Image-like samples: an encoded blob, a label, a caption and a small array, in 8 MiB shards."""
    with varstore.ShardedWriter(
        OUT / "samples", codec="msgpack", max_shard_bytes=8 << 20, metadata={"made_by": "tools/demo.py"}, overwrite=True
    ) as writer:
        for index in range(SAMPLES):
            writer.append(
                {
                    "image": rng.bytes(int(rng.integers(200, 1200))),
                    "label": int(rng.integers(1000)),
                    "caption": f"sample number {index}",
                    "box": rng.random(4).astype(np.float32),
                }
            )


def write_tokens(rng: np.random.Generator) -> None:
    """A language-model corpus: uint16 token documents, written flat in one vectorised call."""
    lengths = rng.lognormal(5.5, 0.7, DOCUMENTS).astype(np.int64) + 1
    tokens = rng.integers(0, 50_257, int(lengths.sum()), dtype=np.uint16)
    with varstore.Writer(OUT / "tokens", codec="ndarray", dtype="uint16", metadata={"vocab": 50_257}, overwrite=True) as writer:
        writer.extend_flat(tokens, lengths)


def timed(action, repeat: int = 1) -> float:
    start = time.perf_counter()
    for _ in range(repeat):
        action()
    return (time.perf_counter() - start) / repeat


def main() -> None:
    rng = np.random.default_rng(0)
    OUT.mkdir(exist_ok=True)
    print(f"writing {SAMPLES} samples into {OUT / 'samples'}/ ...", end="", flush=True)
    print(f" done in {timed(lambda: write_samples(rng)):.2f} s")
    print(f"writing {DOCUMENTS} token documents into {OUT / 'tokens'} ...", end="", flush=True)
    print(f" done in {timed(lambda: write_tokens(rng)):.2f} s")

    open_seconds = timed(lambda: varstore.open(OUT / "tokens").close(), repeat=200)
    samples = varstore.open(OUT / "samples")
    tokens = varstore.open(OUT / "tokens")
    print(f"samples: {len(samples)} records in {len(samples.shard_paths)} shards, codec {samples.codec}")
    print(f"tokens:  {len(tokens)} documents, {tokens.header.data_size // 2} tokens, opened in {open_seconds * 1e6:.0f} µs")

    indices = rng.integers(0, len(tokens), 20_000).tolist()
    single = timed(lambda: [tokens[i] for i in indices]) / len(indices)
    batch = timed(lambda: [tokens.get_batch(indices[k : k + 256]) for k in range(0, len(indices), 256)]) / len(indices)
    print(f"random reads of token documents: {single * 1e9:.0f} ns each, {batch * 1e9:.0f} ns each in batches of 256")

    verify_seconds = timed(samples.verify)
    total_bytes = sum(varstore.open(path).header.data_size for path in samples.shard_paths)
    print(f"verified every checksum of samples/ ({total_bytes / 1e6:.1f} MB) in {verify_seconds * 1e3:.0f} ms")

    index = int(rng.integers(len(samples)))
    record = to_json(samples[index])
    record["image"]["$bytes"] = record["image"]["$bytes"][:32] + "..."
    print(f"samples[{index}] = {json.dumps(record)}")


if __name__ == "__main__":
    main()

"""The seeded synthetic workloads every peer stores and reads: same records, same random indices.

Lengths come from one random stream and contents from another, so a process can
know every record's size (`Workload.sizes`) without generating the data.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np

TOKEN_VOCABULARY = 50257
SEED = 20240605

# name: (records at scale 1, kind); kinds are "array" (uint16 tokens), "bytes" and "sample" (dict records)
DEFAULT_COUNTS = {
    "tokens": (200_000, "array"),  # ~165 MB
    "blobs": (80_000, "bytes"),  # ~740 MB
    "small": (1_000_000, "bytes"),  # ~110 MB
    "structured": (200_000, "sample"),  # ~70 MB
}
OPEN_TEST_RATIO = 100
MIN_RECORDS = 200


@dataclass(frozen=True)
class Workload:
    """`count` records of one kind; `name` also names its directory in each peer's store."""

    name: str
    count: int
    kind: str
    generator: str = ""

    @property
    def shape(self) -> str:
        return self.generator or self.name

    def _rng(self, stream: int) -> np.random.Generator:
        return np.random.default_rng([SEED, sum(map(ord, self.shape)), self.count, stream])

    def lengths(self) -> np.ndarray:
        """Per record: tokens, bytes, or (for samples) floats in the array."""
        rng = self._rng(0)
        if self.shape == "tokens":
            return np.clip(np.rint(rng.lognormal(math.log(300), 0.8, self.count)), 1, 8192).astype(np.int64)
        if self.shape == "blobs":
            return np.clip(np.rint(rng.lognormal(math.log(8192), 0.5, self.count)), 256, 1 << 20).astype(np.int64)
        if self.shape == "small":
            return rng.integers(20, 201, self.count).astype(np.int64)
        return np.clip(np.rint(rng.lognormal(math.log(64), 0.6, self.count)), 1, 4096).astype(np.int64)

    def _text_lengths(self) -> np.ndarray:
        return self._rng(2).integers(20, 81, self.count).astype(np.int64)

    def sizes(self) -> np.ndarray:
        """Payload bytes per record: array bytes, blob bytes, or array + 8-byte label + text bytes."""
        lengths = self.lengths()
        if self.kind == "array":
            return lengths * 2
        if self.kind == "bytes":
            return lengths
        return lengths * 4 + 8 + self._text_lengths()

    @property
    def payload_bytes(self) -> int:
        return int(self.sizes().sum())

    def flat(self) -> tuple[Any, np.ndarray]:
        """(values, lengths): uint16 tokens or payload bytes back to back (not for samples)."""
        lengths = self.lengths()
        rng = self._rng(1)
        total = int(lengths.sum())
        if self.kind == "array":
            return rng.integers(0, TOKEN_VOCABULARY, total, dtype=np.uint16), lengths
        if self.kind == "bytes":
            return rng.bytes(total), lengths
        raise ValueError("sample records have no flat form")

    def records(self) -> list[Any]:
        """The records as a caller would append them: uint16 arrays, bytes, or dicts."""
        if self.kind == "sample":
            return _samples(self)
        values, lengths = self.flat()
        bounds = np.concatenate([[0], np.cumsum(lengths)]).tolist()
        return [values[start:end] for start, end in zip(bounds, bounds[1:])]

    def indices(self, count: int, stream: int = 0) -> np.ndarray:
        """`count` random record indices, the same for every peer."""
        return np.random.default_rng([SEED, stream, self.count]).integers(0, self.count, count)


def _samples(workload: Workload) -> list[dict[str, Any]]:
    lengths, text_lengths = workload.lengths(), workload._text_lengths()
    rng = workload._rng(1)
    floats = rng.standard_normal(int(lengths.sum()), dtype=np.float32)
    text = rng.integers(97, 123, int(text_lengths.sum()), dtype=np.uint8).tobytes().decode("ascii")
    labels = rng.integers(0, 1000, workload.count).tolist()
    array_ends, text_ends = np.cumsum(lengths).tolist(), np.cumsum(text_lengths).tolist()
    return [
        {"array": floats[a_end - a_len : a_end], "label": label, "text": text[t_end - t_len : t_end]}
        for a_end, a_len, t_end, t_len, label in zip(array_ends, lengths.tolist(), text_ends, text_lengths.tolist(), labels)
    ]


def workloads(scale: float) -> list[Workload]:
    """The four workloads at `scale` (1 = the default sizes)."""
    return [Workload(name, max(MIN_RECORDS, round(count * scale)), kind) for name, (count, kind) in DEFAULT_COUNTS.items()]


def open_test_workloads(scale: float) -> list[Workload]:
    """Small records at two sizes `OPEN_TEST_RATIO` apart, for open time and memory on open: a
    "small-1x" workload, and the "small" workload itself."""
    small = next(w for w in workloads(scale) if w.name == "small")
    return [Workload("small-1x", max(1, small.count // OPEN_TEST_RATIO), "bytes", "small"), small]


def all_workloads(scale: float) -> list[Workload]:
    """Every workload a peer stores: the four, and the small one at 1/100 of its records."""
    return workloads(scale) + open_test_workloads(scale)[:1]


def by_name(scale: float, name: str) -> Workload:
    return next(w for w in all_workloads(scale) if w.name == name)


@functools.lru_cache(maxsize=2)
def cached_records(workload: Workload) -> list[Any]:
    """`Workload.records`, generated once per process (peers whose writers call back per input)."""
    return workload.records()


def pack_sample(sample: dict[str, Any]) -> bytes:
    """A dict sample as bytes, for peers that store only bytes (the raw floor, lmdb)."""
    return msgpack.packb([sample["array"].tobytes(), sample["label"], sample["text"]])


def unpack_sample(payload: Any) -> dict[str, Any]:
    array, label, text = msgpack.unpackb(payload)
    return {"array": np.frombuffer(array, np.float32), "label": label, "text": text}


def payload_of(workload: Workload, record: Any) -> Any:
    """The bytes-like payload of `record` for peers that store bytes."""
    return pack_sample(record) if workload.kind == "sample" else record


def record_from_payload(workload: Workload, payload: Any) -> Any:
    """The record a bytes-storing peer returns: tokens as a zero-copy uint16 array, samples decoded, bytes as is."""
    if workload.kind == "array":
        return np.frombuffer(payload, np.uint16)
    if workload.kind == "sample":
        return unpack_sample(payload)
    return payload


def same_record(workload: Workload, expected: Any, actual: Any) -> bool:
    """Whether a peer returned `expected` (bytes-like and arrays compare by content)."""
    if workload.kind == "sample":
        return (np.array_equal(np.asarray(actual["array"]), expected["array"])
                and int(actual["label"]) == expected["label"] and str(actual["text"]) == expected["text"])
    if workload.kind == "array":
        return np.array_equal(np.asarray(actual), expected)
    return bytes(actual) == expected


def touch(record: Any) -> None:
    """Read every byte of a record (what using it does), so a zero-copy view's pages are faulted in."""
    if isinstance(record, dict):
        for value in record.values():
            touch(value)
    elif isinstance(record, np.ndarray):
        record.tobytes()
    elif isinstance(record, (bytes, bytearray, memoryview)):
        bytes(record)

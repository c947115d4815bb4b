"""Round-4 attacks on the C packing of structured records (`speedups.msgpack_pack`): self-referential, deep and wide
records, odd arrays (0-d, read-only, broadcast, relaxed-stride, dtypes with metadata, 32 dimensions), odd keys, and
subclasses whose Python hooks mutate the record while it is walked. Each record is packed by C and by the Python
path alone: C must give the Python path's bytes or decline (None), never crash or differ; and a shard written
with the extension equals one written without it."""

from __future__ import annotations

import contextlib
import os
from typing import ClassVar

import numpy as np
import pytest

import varstore
from varstore._native import speedups
from varstore.errors import RecordTypeError
from varstore.format.codecs import _PACKED_DTYPES as PACKED_DTYPES
from varstore.format.codecs import MsgpackCodec

from .test_speedups import extension_disabled, shard_bytes

pytestmark = pytest.mark.skipif(speedups is None, reason="varstore._speedups was not built (or VARSTORE_NO_EXTENSION is set)")

CODEC = MsgpackCodec()


def nested(depth: int) -> list:
    record: list = []
    for _ in range(depth):
        record = [record]
    return record


def self_list() -> list:
    record: list = [1]
    record.append(record)
    return record


def self_dict() -> dict:
    record: dict = {}
    record["x"] = record
    return record


class MutatingInt(int):
    """An int whose `__index__` and `__eq__` empty the list it sits in, mid-walk."""

    victim: ClassVar[list] = []

    def __index__(self) -> int:
        self.victim.clear()
        return int(self)

    def __eq__(self, other: object) -> bool:
        self.victim.clear()
        return int(self) == other

    __hash__ = int.__hash__


class LyingDict(dict):
    """A dict whose iteration claims keys it does not hold."""

    def __iter__(self):
        return iter(["ghost", *super().__iter__()])

    def items(self):
        return [("ghost", 1), *super().items()]


def mutating_record() -> list:
    record = [1, 2, 3]
    value = MutatingInt(5)
    MutatingInt.victim = record
    record.append(value)
    record.append({"k": value})
    return record


RECORDS = {
    "self-referential list": self_list,
    "self-referential dict": self_dict,
    "63 nested lists": lambda: nested(63),
    "64 nested lists": lambda: nested(64),
    "70 nested lists": lambda: nested(70),
    "70,000 items": lambda: list(range(70_000)),
    "70,000 keys": lambda: {str(index): index for index in range(70_000)},
    "0-d array": lambda: np.array(5, "<i4"),
    "read-only array": lambda: np.frombuffer(b"abcd", "<u1"),
    "relaxed-stride (3, 1)": lambda: np.lib.stride_tricks.as_strided(np.arange(6, dtype="<i4"), (3, 1), (4, 1000)),
    "broadcast (1, 3)": lambda: np.broadcast_to(np.arange(3, dtype="<i4"), (1, 3)),
    "broadcast (2, 3)": lambda: np.broadcast_to(np.arange(3, dtype="<i4"), (2, 3)),
    "dtype with metadata": lambda: np.zeros(3, np.dtype("<i4", metadata={"a": 1})),
    "31 dimensions": lambda: np.zeros((1,) * 31, "<u1"),
    "32 dimensions": lambda: np.zeros((1,) * 32, "<u1"),
    "datetime array": lambda: np.zeros(2, "M8[ns]"),
    "object array": lambda: np.array([1, "a"], dtype=object),
    "structured array": lambda: np.zeros(2, dtype=[("a", "<i4")]),
    "big-endian array": lambda: np.arange(3, dtype=">i4"),
    "huge empty shape": lambda: np.empty((0, 2**40), "<u1"),
    "fixext16-sized array": lambda: np.arange(3, dtype="|u1"),
    "numpy int key": lambda: {np.int64(3): 1},
    "uint64 and int64 edge keys": lambda: {2**64 - 1: 1, -(2**63): 2},
    "key past uint64": lambda: {2**64: 1},
    "bytes key": lambda: {b"a": 1},
    "lone surrogate key": lambda: {"\udc80": 1},
    "lone surrogate value": lambda: ["ok", "\ud800"],
    "memoryview": lambda: memoryview(b"abcdef")[::2],
    "NaN and -0.0": lambda: [float("nan"), -0.0, float("inf")],
    "int subclass that mutates its list": mutating_record,
    "dict subclass that lies when iterated": lambda: LyingDict(a=1),
    "list subclass": lambda: type("L", (list,), {})([1, 2]),
}


def python_outcome(record: object) -> bytes | str:
    try:
        return CODEC._encode_in_python(record)
    except RecordTypeError as error:
        return type(error).__name__


@pytest.mark.parametrize("name", list(RECORDS))
def test_c_packing_gives_the_python_paths_bytes_or_declines(name):
    packed = speedups.msgpack_pack(RECORDS[name](), np.ndarray, PACKED_DTYPES)
    if packed is not None:
        assert packed == python_outcome(RECORDS[name]())


def test_a_list_of_hostile_records_packs_each_as_one_record_alone_would():
    built = [make() for make in RECORDS.values()]
    alone = [speedups.msgpack_pack(make(), np.ndarray, PACKED_DTYPES) for make in RECORDS.values()]
    assert speedups.msgpack_pack_each(built, np.ndarray, PACKED_DTYPES) == alone


def test_a_shard_of_every_writable_hostile_record_is_the_same_file_with_and_without_the_extension(tmp_path):
    writable = []
    for make in RECORDS.values():
        if not isinstance(python_outcome(make()), str):
            writable.append(make)

    def write(prefix):
        with varstore.Writer(prefix, codec="msgpack") as writer:
            writer.extend([make() for make in writable])
        return str(prefix)

    fast = write(tmp_path / "fast")
    with extension_disabled():
        slow = write(tmp_path / "slow")
    assert shard_bytes(fast) == shard_bytes(slow)
    assert len(writable) >= 20 and os.path.getsize(fast + ".data") > 0


def test_a_refused_hostile_record_is_refused_with_the_same_error_with_and_without_the_extension(tmp_path):
    """Through `extend`, where the C path packs the whole batch (`msgpack_pack_each`) and must hand the refusal over."""
    for name in ("self-referential list", "key past uint64", "lone surrogate value", "32 dimensions", "object array"):
        messages = []
        for disabled in (False, True):
            with extension_disabled() if disabled else contextlib.nullcontext():
                prefix = tmp_path / f"{int(disabled)}-{name.replace(' ', '-')}"
                with varstore.Writer(prefix, codec="msgpack") as writer, pytest.raises(RecordTypeError) as refused:
                    writer.extend([{"fine": 1}, RECORDS[name]()])
            messages.append(str(refused.value).replace(str(prefix), "<shard>"))
        assert messages[0] == messages[1], name


def test_batches_past_1024_records_mixing_packed_and_declined_ones_are_the_same_file_either_way(tmp_path):
    """The writer packs 1,024 records per C call and hands declined ones to Python: the join must keep the order."""
    makers = [make for make in RECORDS.values() if not isinstance(python_outcome(make()), str)]
    records = [{"n": index, "value": makers[index % len(makers)]()} if index % 3 else index for index in range(2_500)]

    def write(prefix):
        with varstore.Writer(prefix, codec="msgpack") as writer:
            writer.extend(records)
        return str(prefix)

    fast = write(tmp_path / "fast")
    with extension_disabled():
        slow = write(tmp_path / "slow")
    assert shard_bytes(fast) == shard_bytes(slow)
    with varstore.open(fast) as reader:
        assert [reader[index] for index in range(0, 2_500, 3)] == list(range(0, 2_500, 3))
        assert reader[1]["n"] == 1 and reader[2_498]["n"] == 2_498

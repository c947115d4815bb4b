"""Attacks on the C extension (varstore/_speedups.c) and the paths it speeds up, as a hostile or unlucky user.

What held is kept as regression tests; what broke is marked ``xfail(strict=True)`` with the reason, so the
fix turns it into a failure that says "remove the mark". Crashes are provoked in a child process (a
segfault must not take the test run with it) and every child is waited for with a timeout.
"""

from __future__ import annotations

import ctypes
import enum
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import threading
import zipfile
from array import array
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest

import varstore
from varstore.format import msgpack_bounds as msgpack_check
from varstore._native import speedups
from varstore.format.codecs import NdarrayCodec
from varstore.errors import RecordTypeError, VarstoreError
from varstore.format.msgpack_bounds import MAX_DEPTH, check_msgpack

from .test_speedups import assert_readers_agree, extension_disabled, outcome, patch_offset, reader_pair, write_shard

ROOT = Path(__file__).resolve().parent.parent
CHILD_TIMEOUT = 60

needs_extension = pytest.mark.skipif(speedups is None, reason="varstore._speedups was not built (or VARSTORE_NO_EXTENSION is set)")


def run_child(script: str, *, no_extension: bool = False) -> subprocess.CompletedProcess[str]:
    """Run `script` in a fresh interpreter (with or without the extension) and return how it ended."""
    env = {**os.environ, "VARSTORE_NO_EXTENSION": "1" if no_extension else "0"}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True,
                          timeout=CHILD_TIMEOUT, cwd=ROOT, env=env)


# ---- memory safety: what broke ---------------------------------------------------------------------------

CLOSE_DURING_BATCH = """
    import gc, os, sys, tempfile
    import varstore
    path = os.path.join(tempfile.mkdtemp(), "shard")
    with varstore.Writer(path, "bytes") as writer:
        writer.extend([b"x" * 100_000] * 64)
    reader = varstore.open(path)

    class ClosesTheReader:  # garbage in a cycle: its __del__ runs when a collection happens to start
        def __del__(self):
            reader.close()

    indices = list(range(64))
    gc.collect()
    gc.disable()
    garbage = ClosesTheReader(); garbage.cycle = garbage; del garbage
    gc.set_threshold(1)
    get_batch = reader.get_batch
    gc.enable()  # the next allocation of a container (get_batch's result list) collects, and closes the reader
    try:
        get_batch(indices)
        print("returned")
    except Exception as error:
        print("raised", type(error).__name__)
"""


@needs_extension
def test_get_batch_survives_the_reader_closed_by_a_finalizer_mid_batch():
    result = run_child(CLOSE_DURING_BATCH)
    assert result.returncode == 0, f"killed by signal {-result.returncode}: {result.stderr[-500:]}"


def test_python_get_batch_survives_the_reader_closed_by_a_finalizer_mid_batch():
    """The pure-Python path does not crash (it raises a TypeError rather than ClosedError: see the report)."""
    result = run_child(CLOSE_DURING_BATCH, no_extension=True)
    assert result.returncode == 0, result.stderr[-500:]
    assert result.stdout.startswith(("returned", "raised"))


OFFSETS_CHANGED_DURING_CHECKSUM = """
    import threading
    import numpy as np
    from varstore.format.checksum import crc32c_of_ranges
    data = bytes(64 << 20)
    offsets = np.array([0, 32 << 20, 64 << 20], "<u8")  # valid when the call checks them
    go = threading.Event()

    def tamper():  # runs as soon as the call releases the GIL to checksum over 64 KiB
        go.wait(30)
        offsets[2] = 1 << 62

    thread = threading.Thread(target=tamper)
    thread.start()
    go.set()
    try:
        crc32c_of_ranges(data, offsets)
        print("returned")
    except ValueError:
        print("refused")
    thread.join(30)
"""


@needs_extension
def test_crc32c_of_ranges_survives_offsets_changed_while_it_runs():
    result = run_child(OFFSETS_CHANGED_DURING_CHECKSUM)
    assert result.returncode == 0, f"killed by signal {-result.returncode}: {result.stderr[-500:]}"


# ---- readers: threads, close, fork, spawn, pickle, gc ------------------------------------------------------


def read_until_closed(reader: Any, count: int, started: threading.Event, failures: list[BaseException]) -> None:
    """Read single records and batches until the reader is closed; anything but a VarstoreError is a failure."""
    reads = 0
    try:
        while True:
            k = reads % count
            assert reader[k] == bytes([k]) * 40
            assert reader.get_batch([k, 0]) == [bytes([k]) * 40, b"\0" * 40]
            assert reader.get_batch(np.array([k], np.int64)) == [bytes([k]) * 40]
            reads += 1
            if reads == 50:
                started.set()
    except VarstoreError:
        pass
    except BaseException as error:  # noqa: BLE001 - reported by the test
        failures.append(error)
    finally:
        started.set()


@pytest.mark.parametrize("extension", [
    pytest.param(True, marks=needs_extension),
    pytest.param(False, marks=pytest.mark.xfail(strict=True, reason=(
        "pre-existing, pure-Python path: a read that passed _check_open before another thread's close() then meets "
        "the attributes close() set to None (AttributeError: 'NoneType' object has no attribute 'rows', TypeError: "
        "'NoneType' object is not subscriptable), not ClosedError; README: readers are safe to share between threads"))),
], ids=["C", "python"])
def test_threads_reading_while_another_closes_get_records_or_varstore_errors(tmp_path, extension):
    path = write_shard(str(tmp_path / "shard"), "bytes", [bytes([k]) * 40 for k in range(100)])
    for _ in range(30):
        if extension:
            reader = varstore.open(path)
        else:
            with extension_disabled():
                reader = varstore.open(path)
        assert (reader._slicer is not None) == extension
        failures: list[BaseException] = []
        events = [threading.Event() for _ in range(3)]
        threads = [threading.Thread(target=read_until_closed, args=(reader, 100, event, failures)) for event in events]
        for thread in threads:
            thread.start()
        for event in events:
            assert event.wait(30)
        reader.close()
        for thread in threads:
            thread.join(30)
            assert not thread.is_alive()
        assert failures == []


def test_records_outlive_their_reader_and_its_garbage_collection(tmp_path):
    import gc

    items = [bytes([k]) * 5000 for k in range(20)]
    path = write_shard(str(tmp_path / "shard"), "bytes", items)
    reader = varstore.open(path)
    single, batch = reader[3], reader.get_batch(np.arange(20))
    del reader
    gc.collect()
    assert single == items[3] and batch == items


@needs_extension
def test_a_pickled_reader_gets_its_own_slicer_and_the_same_records(tmp_path):
    items = [f"record {k} é" for k in range(50)]
    path = write_shard(str(tmp_path / "shard"), "str", items)
    with varstore.open(path) as reader:
        copy = pickle.loads(pickle.dumps(reader))
    with copy:
        assert copy._slicer is not None and copy._slicer is not reader._slicer
        assert [copy[k] for k in range(50)] == items and copy.get_batch(list(range(50))) == items


def _read_in_child(reader: Any, connection: Any) -> None:
    connection.send((reader._slicer is not None, reader.get_batch(list(range(len(reader)))), reader[-1]))
    connection.close()


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_reader_used_in_forked_and_spawned_workers_reads_the_same_records(tmp_path, method):
    import multiprocessing

    items = [bytes([k]) * (k + 1) for k in range(64)]
    path = write_shard(str(tmp_path / "shard"), "bytes", items)
    context = multiprocessing.get_context(method)
    with varstore.open(path) as reader:
        assert reader[0] == items[0]  # maps in use before the fork
        receiver, sender = context.Pipe(duplex=False)
        process = context.Process(target=_read_in_child, args=(reader, sender))
        process.start()
        sender.close()
        assert receiver.poll(CHILD_TIMEOUT)
        has_slicer, batch, last = receiver.recv()
        process.join(CHILD_TIMEOUT)
        assert process.exitcode == 0
        assert batch == items and last == items[-1]
        assert has_slicer == (speedups is not None)
        assert reader.get_batch([5, 6]) == items[5:7]  # the parent's reader is untouched


TRUNCATED_UNDER_READER = """
    import os, sys, tempfile
    import varstore
    path = os.path.join(tempfile.mkdtemp(), "shard")
    with varstore.Writer(path, "bytes") as writer:
        writer.extend([bytes([k % 256]) * 4096 for k in range(64)])
    reader = varstore.open(path)
    print(reader._slicer is not None, flush=True)
    os.truncate(path + WHICH, 0)
    try:
        print(len(reader[50]), flush=True)
    except Exception as error:
        print("raised", type(error).__name__, flush=True)
"""


@needs_extension
@pytest.mark.parametrize("which", [".data", ".index"])
def test_a_file_truncated_under_an_open_reader_ends_the_same_way_with_and_without_the_extension(which):
    """Truncating a mapped file under a reader is SIGBUS for both paths (a property of mmap, pre-existing):
    the C path neither hides it nor turns it into something worse."""
    script = TRUNCATED_UNDER_READER.replace("WHICH", repr(which))
    fast, slow = run_child(script), run_child(script, no_extension=True)
    assert fast.stdout.split("\n")[0] == "True" and slow.stdout.split("\n")[0] == "False"
    assert fast.returncode == slow.returncode == -signal.SIGBUS


# ---- index types the C reads must decline, or read exactly as Python does -----------------------------------


class Position(enum.IntEnum):
    FIRST = 0
    LAST = -1


class MyInt(int):
    pass


class MyInt64(np.int64):
    pass


def odd_singles() -> list[Any]:
    return [Position.FIRST, Position.LAST, MyInt(1), MyInt(-1), MyInt64(2), np.uint8(1), np.int64(-5),
            2**63 - 1, -(2**63), 2**64 - 1, 2**64, -(2**64), True, np.True_, np.array(3), np.array([3])]


def odd_batches(count: int) -> list[Any]:
    every = np.arange(count, dtype=np.int64)
    readonly = every.copy()
    readonly.flags.writeable = False
    column = np.stack([every, every]).T[:, 0]  # a non-contiguous int64 view
    fortran = np.asfortranarray(np.stack([every, every]))
    c_int64 = (ctypes.c_int64 * count)(*range(count))
    return [
        [Position.FIRST, Position.LAST], (Position.LAST,), [MyInt(0)], [np.int64(0), np.int64(1)], [MyInt64(1)],
        [True], [0, True], [0, 2**63], [0, -(2**63)], [2**64], [-(2**64)], [0, 1.0],
        readonly, column, fortran, fortran[0], every.astype(">i8"), every.astype(np.uint64), every.astype(np.int32),
        every.astype(bool), every.astype(object), every.astype(float), every.astype("datetime64[s]"),
        every.view(MyArray), np.ma.masked_array(every, mask=every % 2 == 0), np.array(0), np.int64(0),
        memoryview(every.tobytes()).cast("q"), memoryview(every.tobytes()).cast("Q"), array("l", range(count)),
        c_int64, np.full(3, 2**62, np.int64), np.full(3, -(2**63), np.int64), np.array([count - 1] * 10_000, np.int64),
        memoryview(every.tobytes()).cast("B"), every.tobytes(), bytearray(every.tobytes()),
    ]


class MyArray(np.ndarray):
    pass


@needs_extension
@pytest.mark.parametrize("codec", ["bytes", "str"])
@pytest.mark.parametrize("forged", [None, (3, 2**64 - 1), (3, 1), (4, 10**6)], ids=["sound", "2**64-1", "decreasing", "past the data"])
def test_odd_indices_read_what_the_python_path_reads_or_raise_what_it_raises(tmp_path, codec, forged):
    items = [f"record{k}" for k in range(8)]
    path = write_shard(str(tmp_path / "shard"), codec, [item.encode() for item in items] if codec == "bytes" else items)
    if forged is not None:
        patch_offset(path, *forged)
    with reader_pair(path) as (fast, slow):
        for index in odd_singles():
            assert outcome(lambda: fast[index]) == outcome(lambda: slow[index]), repr(index)
        for indices in odd_batches(8):
            assert outcome(lambda: fast.get_batch(indices)) == outcome(lambda: slow.get_batch(indices)), repr(indices)
        assert_readers_agree(fast, slow)


# ---- msgpack_passes: never True where the Python walk refuses ---------------------------------------------


def python_accepts(payload: bytes, ext_type: int) -> bool:
    saved, msgpack_check.speedups = msgpack_check.speedups, None
    try:
        check_msgpack(payload, ext_type)
    except ValueError:
        return False
    finally:
        msgpack_check.speedups = saved
    return True


def assert_sound(payload: bytes, ext_type: int = 0) -> bool:
    """msgpack_passes answers True only where the Python walk accepts; returns the Python walk's answer."""
    accepted = python_accepts(payload, ext_type)
    if speedups is not None and speedups.msgpack_passes(payload, ext_type):
        assert accepted, payload[:80].hex()
    return accepted


def nested(depth: int, kind: str) -> bytes:
    opener = {"map": b"\x81\xa1k", "array": b"\x91", "map16": b"\xde\x00\x01\xa1k", "array32": b"\xdd\x00\x00\x00\x01"}[kind]
    return opener * depth + b"\xc0"


@pytest.mark.parametrize("kind", ["map", "array", "map16", "array32"])
def test_msgpack_nesting_at_the_limit_passes_and_one_deeper_is_refused(kind):
    assert assert_sound(nested(MAX_DEPTH, kind))
    assert speedups is None or speedups.msgpack_passes(nested(MAX_DEPTH, kind), 0)  # the fast path still answers
    assert not assert_sound(nested(MAX_DEPTH + 1, kind))
    assert not assert_sound(nested(100_000, kind))


INT_KEY_FORMS = [  # every width and signedness msgpack has for an integer key, as (format, size)
    (b"\xcc", 1, False), (b"\xcd", 2, False), (b"\xce", 4, False), (b"\xcf", 8, False),
    (b"\xd0", 1, True), (b"\xd1", 2, True), (b"\xd2", 4, True), (b"\xd3", 8, True),
]


def int_key_forms(value: int) -> list[bytes]:
    forms = [bytes([value & 0xFF])] if 0 <= value < 0x80 or -32 <= value < 0 else []
    for prefix, size, signed in INT_KEY_FORMS:
        try:
            forms.append(prefix + value.to_bytes(size, "big", signed=signed))
        except OverflowError:
            pass
    return forms


def str_key_forms(text: bytes) -> list[bytes]:
    forms = [bytes([0xA0 | len(text)]) + text] if len(text) < 32 else []
    return forms + [b"\xd9" + bytes([len(text)]) + text, b"\xda" + len(text).to_bytes(2, "big") + text,
                    b"\xdb" + len(text).to_bytes(4, "big") + text]


@pytest.mark.parametrize("value", [0, 1, 127, 128, 255, 256, -1, -32, -33, -128, -129, 2**31, 2**63 - 1, 2**63, 2**64 - 1, -(2**63)])
def test_msgpack_duplicate_integer_keys_in_every_width_pair_are_refused(value):
    forms = int_key_forms(value)
    for first in forms:
        for second in forms:
            assert not assert_sound(b"\x82" + first + b"\xc0" + second + b"\xc0")
            assert not assert_sound(b"\x93\x01\x82" + first + b"\x90" + second + b"\x80\x02")  # nested, not first
    other = int_key_forms(value + 1) + int_key_forms(-value - 1 if value >= 0 else value + 2**64)
    for first in forms:
        for second in other:
            assert assert_sound(b"\x82" + first + b"\xc0" + second + b"\xc0")  # equal bits, another value


@pytest.mark.parametrize("text", [b"", b"a", b"k" * 31, b"k" * 32, b"\x00", b"\xff\xfe"])
def test_msgpack_duplicate_str_keys_in_every_width_pair_are_refused(text):
    for first in str_key_forms(text):
        for second in str_key_forms(text):
            assert not assert_sound(b"\x82" + first + b"\xc0" + second + b"\xc0")
        for number in int_key_forms(len(text)):
            assert assert_sound(b"\x82" + first + b"\xc0" + number + b"\xc0")  # a str and an int never collide


@pytest.mark.parametrize("count", [31, 32, 33, 1023, 1024, 1025, 1100])
def test_msgpack_many_keys_and_many_open_keys_are_never_wrongly_accepted(count):
    flat = b"\xde" + count.to_bytes(2, "big") + b"".join(b"\xcd" + k.to_bytes(2, "big") + b"\xc0" for k in range(count))
    assert assert_sound(flat)
    duplicated = flat[:-4] + b"\xcd\x00\x00\xc0"  # the last key repeats the first
    assert not assert_sound(duplicated)
    # `count` maps open at once, each with keys still live below the next: the C key stack overflows past 1024
    open_keys = b"".join(b"\x82\x00\xc0\x01" for _ in range(min(count, MAX_DEPTH))) + b"\xc0" * 1
    assert_sound(open_keys)
    repeated_deep = b"".join(b"\x82\x00\xc0\x00" for _ in range(min(count, MAX_DEPTH) // 16)) + b"\xc0"
    assert not assert_sound(repeated_deep)


@pytest.mark.parametrize("ext_type", [-128, -1, 0, 1, 127])
def test_msgpack_every_extension_form_passes_only_with_the_allowed_type(ext_type):
    for code in (-128, -1, 0, 1, 127, ext_type):
        type_byte = (code & 0xFF).to_bytes(1, "big")
        forms = [bytes([0xD4 + k]) + type_byte + b"x" * (1 << k) for k in range(5)]
        forms += [b"\xc7\x03" + type_byte + b"abc", b"\xc8\x00\x03" + type_byte + b"abc", b"\xc9\x00\x00\x00\x03" + type_byte + b"abc",
                  b"\xc7\x00" + type_byte]
        for form in forms:
            assert assert_sound(form, ext_type) == (code == ext_type)
            assert not assert_sound(form[:-1], ext_type)
            assert not assert_sound(form + b"\xc0", ext_type)


def test_msgpack_lengths_with_the_top_bit_set_are_refused():
    for prefix in (b"\xc6", b"\xdb", b"\xdd", b"\xdf"):
        for length in (2**31, 2**32 - 1, 2**31 - 1):
            assert not assert_sound(prefix + length.to_bytes(4, "big") + b"\xc0" * 16)
    assert not assert_sound(b"\xc9" + (2**32 - 1).to_bytes(4, "big") + b"\x00" + b"\xc0" * 16)


def test_msgpack_a_record_cut_at_every_byte_is_refused_and_sound_wherever_it_is_damaged():
    record = {"a": [1, -1, 2**40, -(2**40), 1.5, None, True, b"bin" * 30, "s" * 40, {"n": {7: [], -3: {}}}],
              "b": msgpack.ExtType(0, b"xyzw"), 300: "x" * 300, -300: list(range(20))}
    payload = msgpack.packb(record, use_bin_type=True)
    assert speedups is None or speedups.msgpack_passes(payload, 0)
    assert assert_sound(payload)
    for cut in range(len(payload)):
        assert not assert_sound(payload[:cut])
    for position in range(len(payload)):
        for byte in (0x00, 0x7F, 0x80, 0x8F, 0xC1, 0xD4, 0xD8, 0xDC, 0xDF, 0xFF):
            assert_sound(payload[:position] + bytes([byte]) + payload[position + 1 :])


# ---- writers: the same bytes, whatever the record's layout -------------------------------------------------


def arrays_for(dtype: str, shape: tuple[int, ...]) -> list[Any]:
    base = np.arange(6 * 4 * max(1, int(np.prod(shape))), dtype=np.int64).reshape(-1, *shape) if shape else np.arange(24)
    exact = base.astype(dtype)
    fortran = np.asfortranarray(exact)
    return [exact, fortran, exact[::-1], exact[::2], exact[:0], exact.astype(exact.dtype.newbyteorder()),
            exact.view(MyArray), np.ma.masked_array(exact, mask=np.zeros(exact.shape, bool)), exact.astype(np.int16),
            exact.tolist(), exact.astype(object), np.lib.stride_tricks.as_strided(exact, exact.shape, (0,) * exact.ndim)]


@pytest.mark.parametrize("dtype, shape", [("<i4", ()), (">i4", ()), ("<f8", (3,)), (">f8", (3,)), ("<u2", (2, 2)),
                                          ("|b1", ()), ("|u1", (5,)), ("<i8", (1,))])
def test_ndarray_encode_fast_path_writes_exactly_what_the_general_path_writes(dtype, shape):
    fast = NdarrayCodec(dtype, shape)
    general = NdarrayCodec(dtype, shape)
    general._plain_dtype = None  # no array takes the fast path
    records = arrays_for(dtype if dtype != "|b1" else "u1", shape)
    if dtype == "|b1":
        records = [np.asarray(record) % 2 == 0 if not isinstance(record, list) else record for record in records[:5]]
    for record in records:
        assert outcome(lambda: bytes(fast.encode(record))) == outcome(lambda: bytes(general.encode(record))), repr(record)[:200]
        assert outcome(lambda: fast.encode_many([record, record])) == outcome(lambda: general.encode_many([record, record]))


@pytest.mark.parametrize("record", [np.array(["2020-01-01"], "datetime64[D]"), np.array([1], "timedelta64[s]"),
                                    np.array(["ab"]), np.array([b"ab"]), np.array([1 + 2j])], ids=str)
def test_ndarray_writer_refuses_records_of_dtypes_that_cannot_be_stored(tmp_path, record):
    with varstore.Writer(tmp_path / "shard", "ndarray", dtype="int64") as writer:
        with pytest.raises(RecordTypeError):
            writer.append(record)
        with pytest.raises(RecordTypeError):
            writer.extend([np.arange(3), record])
        assert len(writer) == 1  # a refused chunk goes one by one: the record before it lands
    with varstore.open(tmp_path / "shard") as reader:
        assert [list(r) for r in reader] == [[0, 1, 2]]


def test_extend_from_a_generator_that_also_appends_keeps_every_record(tmp_path):
    """Extend buffers a chunk before writing it, so records the generator appends land before the chunk they
    were appended during; nothing is lost or written twice, and append's indices point at its records."""
    positions: dict[int, bytes] = {}

    def records(writer: varstore.Writer) -> Any:
        for k in range(2500):
            if k % 7 == 0:
                positions[writer.append(b"appended %d" % k)] = b"appended %d" % k
            yield b"extended %d" % k

    def write(path: Path) -> list[bytes]:
        positions.clear()
        with varstore.Writer(path, "bytes") as writer:
            writer.extend(records(writer))
        with varstore.open(path) as reader:
            stored = list(reader)
        assert all(stored[position] == record for position, record in positions.items())
        return stored

    stored = write(tmp_path / "fast")
    assert sorted(stored) == sorted([b"extended %d" % k for k in range(2500)] + [b"appended %d" % k for k in range(0, 2500, 7)])
    with extension_disabled():
        assert write(tmp_path / "slow") == stored


def test_keyboard_interrupt_mid_extend_keeps_what_the_iterable_gave_before_it(tmp_path):
    def interrupted() -> Any:
        for k in range(1500):
            yield b"r%d" % k
        raise KeyboardInterrupt

    for name, disabled in (("fast", False), ("slow", True)):
        with varstore.Writer(tmp_path / name, "bytes") as writer:
            with pytest.raises(KeyboardInterrupt):
                if disabled:
                    with extension_disabled():
                        writer.extend(interrupted())
                else:
                    writer.extend(interrupted())
            assert len(writer) == 1500
        with varstore.open(tmp_path / name) as reader:
            reader.verify()
            assert list(reader) == [b"r%d" % k for k in range(1500)]
    assert (tmp_path / "fast.data").read_bytes() == (tmp_path / "slow.data").read_bytes()
    assert (tmp_path / "fast.index").read_bytes() == (tmp_path / "slow.index").read_bytes()


def test_sharded_writer_killed_mid_extend_resumes_to_the_same_dataset(memory_path):
    from .test_crash import check_sharded_after_crash, reference_layout

    options = dict(max_shard_records=300)
    records = [b"%d" % k * (k % 5) for k in range(3000)]
    layout = reference_layout(memory_path, records, options)
    for run, kill_after in enumerate((1, 700, 1800, 2999)):
        directory = memory_path / f"run-{run}"
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            os.close(read_end)
            try:
                def reporting() -> Any:
                    for record in records:
                        os.write(write_end, b".")
                        yield record

                with varstore.ShardedWriter(directory, **options) as writer:
                    writer.extend(reporting())
            finally:
                os._exit(0)
        os.close(write_end)
        seen = 0
        while seen < kill_after:
            chunk = os.read(read_end, 65536)
            if not chunk:
                break
            seen += len(chunk)
        os.kill(pid, signal.SIGKILL)
        os.close(read_end)
        os.waitpid(pid, 0)
        check_sharded_after_crash(directory, records, options, layout)


# ---- install without a compiler ----------------------------------------------------------------------------


@pytest.mark.skipif(not os.path.exists("/bin/false"), reason="needs /bin/false as a compiler that always fails")
def test_a_wheel_built_without_a_compiler_installs_and_runs_pure_python(tmp_path):
    from .test_install import _copy_sources

    sources, wheels, target, work = (tmp_path / name for name in ("src", "wheels", "target", "work"))
    for directory in (sources, work):
        directory.mkdir()
    _copy_sources(sources)
    environment = {**os.environ, "CC": "/bin/false", "LDSHARED": "/bin/false"}
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels), str(sources)],
                           capture_output=True, text=True, timeout=120, env=environment)
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = wheels.glob("varstore-*.whl")
    with zipfile.ZipFile(wheel) as archive:  # tagged for this platform (it has ext_modules), but nothing compiled
        assert not [name for name in archive.namelist() if name.endswith((".so", ".pyd"))]
    installed = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
                               capture_output=True, text=True, timeout=120)
    assert installed.returncode == 0, installed.stderr[-2000:]
    assert not list(target.glob("varstore/_speedups*.so"))
    script = """
        import os, varstore, varstore._native
        assert varstore.__file__.startswith(os.environ["TARGET"]), varstore.__file__
        assert varstore._native.speedups is None
        with varstore.Writer("shard", "str") as writer:
            writer.extend(["a", "bé", ""] * 1000)
        with varstore.open("shard") as reader:
            reader.verify()
            assert reader._slicer is None and reader.get_batch([0, 1, -1]) == ["a", "bé", ""]
        print("ok")
    """
    # -S: no .pth files, so the dev venv's editable install cannot hand out the work tree's built extension;
    # its site-packages still provides numpy, msgpack and crc32c, after the installed wheel.
    path = os.pathsep.join([str(target), *(entry for entry in sys.path if entry.endswith("site-packages"))])
    ran = subprocess.run([sys.executable, "-S", "-c", textwrap.dedent(script)], capture_output=True, text=True, timeout=60, cwd=work,
                         env={**os.environ, "PYTHONPATH": path, "TARGET": str(target), "VARSTORE_NO_EXTENSION": ""})
    assert ran.returncode == 0 and ran.stdout.strip() == "ok", ran.stderr[-2000:]


# ---- sharded writers: extend lays shards out as appends one by one do --------------------------------------


def shard_layout(directory: Path) -> list[list[bytes]]:
    with varstore.open(directory) as dataset:
        return [list(varstore.open(directory / entry.name)) for entry in dataset.manifest.shards]


@pytest.mark.parametrize("options", [dict(max_shard_bytes=1000), dict(max_shard_bytes=1), dict(max_shard_records=1),
                                     dict(max_shard_records=1024), dict(max_shard_bytes=4096, max_shard_records=7)], ids=str)
def test_sharded_extend_and_extend_flat_lay_out_shards_as_appends_one_by_one(memory_path, options):
    sizes = [0, 1, 999, 1000, 1001, 5000, 0, 0, 17] * 8 + [3] * 1030  # more than one 1,024-record chunk of extend
    if options.get("max_shard_bytes") == 1 or options.get("max_shard_records") == 1:
        sizes = sizes[:100]  # a shard per record: keep the shard count small
    records = [bytes([k % 251]) * size for k, size in enumerate(sizes)]
    with varstore.ShardedWriter(memory_path / "append", **options) as writer:
        for record in records:
            writer.append(record)
    with varstore.ShardedWriter(memory_path / "extend", **options) as writer:
        writer.extend(iter(records))
    with varstore.ShardedWriter(memory_path / "flat", **options) as writer:
        writer.extend_flat(b"".join(records), sizes)
    expected = shard_layout(memory_path / "append")
    assert shard_layout(memory_path / "extend") == expected
    assert shard_layout(memory_path / "flat") == expected


def test_writers_refuse_appends_and_extends_after_close_and_abort(tmp_path):
    for make in (lambda name: varstore.Writer(tmp_path / name, "bytes"), lambda name: varstore.ShardedWriter(tmp_path / name)):
        for name, end in (("closed", "close"), ("aborted", "abort")):
            writer = make(name + type(make).__name__ + str(id(make)))
            writer.append(b"kept")
            getattr(writer, end)()
            for attempt in (lambda: writer.append(b"x"), lambda: writer.extend([b"x"] * 3000), lambda: writer.extend(iter([b"x"]))):
                with pytest.raises(VarstoreError):
                    attempt()


# ---- torch: DataLoader workers read through their own slicer ----------------------------------------------


class ReaderDataset:
    """The smallest map-style dataset over a Reader: what a user writes before finding varstore.torch."""

    def __init__(self, reader: Any) -> None:
        self.reader = reader

    def __len__(self) -> int:
        return len(self.reader)

    def __getitem__(self, index: int) -> Any:
        return self.reader[index]

    def __getitems__(self, indices: list[int]) -> list[Any]:
        return self.reader.get_batch(indices)


@pytest.mark.parametrize("batched", [False, True], ids=["single reads", "get_batch"])
def test_dataloader_fork_workers_read_the_same_records(tmp_path, batched):
    torch = pytest.importorskip("torch")
    items = [f"text {k}" for k in range(200)]
    path = write_shard(str(tmp_path / "shard"), "str", items)
    with varstore.open(path) as reader:
        dataset = ReaderDataset(reader)
        if not batched:
            dataset.__getitems__ = None  # type: ignore[method-assign]  # DataLoader falls back to one read per item
        loader = torch.utils.data.DataLoader(dataset, batch_size=16, num_workers=2, collate_fn=list, timeout=60,
                                             multiprocessing_context="fork")
        assert [record for batch in loader for record in batch] == items


# ---- extend's chunks against "as append would one by one" -------------------------------------------------


class NoArray:
    """A record numpy cannot make an array of: its __array__ raises ValueError, not RecordTypeError."""

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        raise ValueError("this object refuses to become an array")


def sharded_or_single(kind: str, path: Path) -> Any:
    return varstore.Writer(path, "ndarray", dtype="int64") if kind == "Writer" else varstore.ShardedWriter(path, "ndarray", dtype="int64")


@pytest.mark.parametrize("kind", ["Writer", "ShardedWriter"])
@pytest.mark.parametrize("as_list", [True, False], ids=["list", "generator"])
def test_extend_keeps_the_records_before_one_whose_encoding_raises(tmp_path, kind, as_list):
    records = [np.arange(3)] * 10 + [NoArray()] + [np.arange(2)]
    with sharded_or_single(kind, tmp_path / "appended") as writer:
        with pytest.raises(ValueError, match="refuses to become an array"):
            for record in records:
                writer.append(record)
        appended = len(writer)
    with sharded_or_single(kind, tmp_path / "extended") as writer:
        with pytest.raises(ValueError, match="refuses to become an array"):
            writer.extend(records if as_list else iter(records))
        assert len(writer) == appended == 10


class InterruptingText(str):
    """A record whose encoding is where Ctrl-C lands."""

    def encode(self, *args: Any, **kwargs: Any) -> bytes:
        raise KeyboardInterrupt


def test_keyboard_interrupt_while_a_chunk_is_encoded_leaves_a_consistent_shard_that_len_describes(tmp_path):
    """An interrupt during encoding drops the chunk being encoded (up to 1,023 records the iterable gave; one by
    one only the record in flight): what was added before stays, len(writer) counts exactly that, and it closes
    into a shard that verifies."""
    records = [f"r{k}" for k in range(1500)] + [InterruptingText("x")] + ["after"]
    with varstore.Writer(tmp_path / "shard", "str") as writer:
        with pytest.raises(KeyboardInterrupt):
            writer.extend(iter(records))
        landed = len(writer)
    assert landed in (1024, 1500)  # the first chunk; one by one would give 1500
    with varstore.open(tmp_path / "shard") as reader:
        reader.verify()
        assert list(reader) == records[:landed]


def generator_that_appends(writer: Any) -> Any:
    for k in range(3):
        writer.append(b"appended %d" % k)
        yield b"extended %d" % k


def generator_that_closes(writer: Any) -> Any:
    yield b"extended 0"
    yield b"extended 1"
    writer.close()


@pytest.mark.xfail(strict=True, reason="extend buffers up to 1,024 records before adding them: a generator that "
                   "appends to the same writer sees its appends land before the records it yielded earlier; one that "
                   "closes the writer loses what it yielded and extend raises ClosedError")
@pytest.mark.parametrize("make_records", [generator_that_appends, generator_that_closes])
def test_extend_of_a_generator_that_uses_its_writer_acts_as_appends_one_by_one(tmp_path, make_records):
    def one_by_one(writer: Any) -> None:
        for record in make_records(writer):
            writer.append(record)

    for name, fill in (("appended", one_by_one), ("extended", lambda writer: writer.extend(make_records(writer)))):
        writer = varstore.Writer(tmp_path / name, "bytes")
        fill(writer)
        writer.close()
    with varstore.open(tmp_path / "appended") as appended, varstore.open(tmp_path / "extended") as extended:
        assert list(extended) == list(appended)


@needs_extension
@pytest.mark.parametrize("codec", ["bytes", "str"])
@pytest.mark.parametrize("count", [1, 3, 1025])
def test_a_shard_of_empty_records_with_an_empty_data_file_reads_as_the_python_path_reads(tmp_path, codec, count):
    path = write_shard(str(tmp_path / "shard"), codec, [b"" if codec == "bytes" else ""] * count)
    assert os.path.getsize(path + ".data") == 0
    with reader_pair(path) as (fast, slow):
        assert fast._fast_get(0) == (b"" if codec == "bytes" else "")  # the C path answers, from an empty map
        assert_readers_agree(fast, slow)
        for indices in odd_batches(count):
            assert outcome(lambda: fast.get_batch(indices)) == outcome(lambda: slow.get_batch(indices)), repr(indices)

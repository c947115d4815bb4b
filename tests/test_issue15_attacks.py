"""Attacks on issue 15's recent changes, as a hostile or unlucky user would make them.

1. `prefetch_index` / `looks_cached`: ``mincore`` of the pages holding an index's middle and last bytes decides
   whether it is cached; only a cold index of at most `PREFETCH_LIMIT` bytes is advised.
2. `codecs._unpack_array`: a msgpack array header decoded before is not parsed again (`_ARRAY_HEADERS`); on every
   input it must behave exactly as the uncached `_parse_array`.
3. `collate.stored_tensor_batch` / `RecordDataset._samples_from`: a batch of ndarray records becomes tensors with one
   conversion (one buffer, a tensor of its own storage per sample).
4. `collate._flat_tensors`: tensor samples are concatenated with one ``torch.cat``; anything it does not take must
   behave as the per-sample path does (`_flat_tensors` returning None).

Six bugs the attack found are fixed and their tests pass: a size-0 probe at offset -1, an index without
checksums judged after the open had read its last page, batch samples sharing one autograd version counter and one
storage (saving one sample saved the batch), a conj-bit tensor beside a numpy sample, a sparse sample reaching
``torch.cat``. On tmpfs the pages are the file: an index there looks cached and is not advised.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import ctypes
import io
import itertools
import mmap
import multiprocessing
import os
import random
import struct
import sys
import threading
from pathlib import Path
from typing import Any, Callable

import msgpack
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import varstore
from varstore.format import codecs as codecs_module
from varstore.format import header as fmt
from varstore.format.codecs import ALLOWED_DTYPES, MsgpackCodec
from varstore.torch import RecordDataset, collate_jagged, collate_padded
from varstore.torch import collate as collate_module

from .test_index_prefetch import cache_only_the_page_at, evict, open_as_probed, resident_fraction, resident_pages
from varstore.local import mapping
from varstore.local.mapping import PREFETCH_LIMIT, looks_cached, prefetch_index

LINUX = sys.platform.startswith("linux")
# How long a test waits for its worker processes (a pool's results, a DataLoader's batch) before failing: a safety
# net against a hang, never an expectation of speed (a spawned worker imports torch: seconds, or minutes on a busy
# machine). The tests that wait so are stopped only after WORKER_TEST_TIMEOUT, so the net fails them first.
WORKER_SAFETY_NET_S = 600
WORKER_TEST_TIMEOUT = WORKER_SAFETY_NET_S + 300


# ======================================================================================================
# 1. Index prefetch: `looks_cached` and `prefetch_index`
# ======================================================================================================

needs_mincore = pytest.mark.skipif(not LINUX or not hasattr(os, "posix_fadvise"), reason="needs Linux mincore and posix_fadvise")


def write_byte_shard(path: Path, records: int, *, checksums: bool = True) -> tuple[Path, Path]:
    """A shard of `records` one-byte records; (index, data) paths."""
    with varstore.Writer(path, codec="bytes", checksums=checksums) as writer:
        writer.extend_flat(np.zeros(records, np.uint8), np.ones(records, np.int64))
    data, index = fmt.shard_paths(os.fspath(path))
    return Path(index), Path(data)


@contextlib.contextmanager
def recorded_advice(monkeypatch: pytest.MonkeyPatch):
    advised: list[tuple[int, int, int, int]] = []
    monkeypatch.setattr(os, "posix_fadvise", lambda *arguments: advised.append(arguments))
    yield advised


@needs_mincore
def test_probe_of_a_pipe_says_not_cached_raises_nothing_and_consumes_no_byte():
    read_end, write_end = os.pipe()
    try:
        os.write(write_end, b"xyz")
        assert looks_cached(read_end, 3) is False
        assert prefetch_index(read_end, 3) is False  # ESPIPE from the advice is swallowed
        assert os.read(read_end, 10) == b"xyz"
    finally:
        os.close(read_end)
        os.close(write_end)


@needs_mincore
def test_probe_of_a_directory_or_closed_descriptor_never_raises(tmp_path):
    directory = os.open(tmp_path, os.O_RDONLY)
    try:
        assert looks_cached(directory, 4096) is False
        prefetch_index(directory, 4096)  # whatever it answers, it must not raise
    finally:
        os.close(directory)
    closed = os.open(tmp_path, os.O_RDONLY)
    os.close(closed)
    assert looks_cached(closed, 100) is False
    assert prefetch_index(closed, 100) is False  # EBADF from the advice is swallowed


@needs_mincore
def test_probe_of_a_cached_one_byte_file_says_cached_and_leaves_the_file_offset_alone(tmp_path):
    path = tmp_path / "one"
    path.write_bytes(b"z")
    fd = os.open(path, os.O_RDONLY)
    try:
        os.pread(fd, 1, 0)  # cached
        assert looks_cached(fd, 1) is True
        assert os.lseek(fd, 0, os.SEEK_CUR) == 0
    finally:
        os.close(fd)


@needs_mincore
def test_probe_of_an_empty_file_says_cached_and_advises_nothing(tmp_path):
    path = tmp_path / "empty"
    path.write_bytes(b"")
    fd = os.open(path, os.O_RDONLY)
    try:
        assert looks_cached(fd, 0) is True  # nothing to read
        assert prefetch_index(fd, 0) is True  # the loop over range(0, 0) advises nothing
        assert os.lseek(fd, 0, os.SEEK_CUR) == 0
    finally:
        os.close(fd)


@needs_mincore
def test_probe_with_a_size_of_zero_never_moves_the_file_offset(tmp_path):
    path = tmp_path / "grew"
    path.write_bytes(b"abcdef")  # the file grew after its size (0) was taken
    fd = os.open(path, os.O_RDONLY)
    try:
        os.pread(fd, 6, 0)
        prefetch_index(fd, 0)
        assert os.lseek(fd, 0, os.SEEK_CUR) == 0
    finally:
        os.close(fd)


@needs_mincore
def test_a_file_truncated_after_its_size_was_taken_is_advised_not_refused(tmp_path):
    path = tmp_path / "shrunk"
    path.write_bytes(bytes(10_000))
    fd = os.open(path, os.O_RDONLY)
    try:
        os.pread(fd, 10_000, 0)
        os.truncate(path, 10)  # probes at 50_000 and 99_999 of the size taken before: past the end, 0 bytes read
        assert looks_cached(fd, 100_000) is False
        assert prefetch_index(fd, 100_000) is True
        os.truncate(path, 0)
        assert looks_cached(fd, 100_000) is False
    finally:
        os.close(fd)


def test_an_index_of_exactly_the_limit_is_advised_one_byte_over_is_not(monkeypatch):
    with recorded_advice(monkeypatch) as advised:
        assert prefetch_index(-1, PREFETCH_LIMIT)
        assert sum(length for _, _, length, _ in advised) == PREFETCH_LIMIT
        advised.clear()
        assert not prefetch_index(-1, PREFETCH_LIMIT + 1)
        assert advised == []


class RefusingLibc:
    """A C library whose `mmap` of a page fails, or whose `mincore` fails or finds the page absent (`failing`)."""

    def __init__(self, failing: str) -> None:
        self.failing = failing

    def mmap(self, address, length, protection, flags, fd, offset):
        return ctypes.c_void_p(-1).value if self.failing == "mmap" else 4096

    def mincore(self, address, length, vector):
        if self.failing == "mincore":
            return -1
        vector.raw = b"\x00"  # "absent": the resident bit clear
        return 0

    def munmap(self, address, length):
        return 0


@pytest.mark.parametrize("failing", ["mmap", "mincore", "absent"])
def test_a_probe_that_cannot_tell_or_finds_a_page_absent_means_advice_and_open_still_works(tmp_path, monkeypatch,
                                                                                            failing):
    index, _ = write_byte_shard(tmp_path / "shard", 1000)
    monkeypatch.setattr(mapping, "_libc", lambda: RefusingLibc(failing))
    fd = os.open(index, os.O_RDONLY)
    try:
        assert looks_cached(fd, index.stat().st_size) is False
    finally:
        os.close(fd)
    with recorded_advice(monkeypatch) as advised:
        with varstore.open(tmp_path / "shard") as reader:
            assert reader[999] == b"\0"
    assert sum(length for _, _, length, _ in advised) == index.stat().st_size


def test_without_mincore_every_index_under_the_limit_is_advised(tmp_path, monkeypatch):
    index, _ = write_byte_shard(tmp_path / "shard", 1000)
    index.read_bytes()
    monkeypatch.setattr(mapping, "_libc", lambda: None)
    with recorded_advice(monkeypatch) as advised:
        with varstore.open(tmp_path / "shard") as reader:
            assert reader[0] == b"\0"
    assert sum(length for _, _, length, _ in advised) == index.stat().st_size


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no /dev/shm")
def test_a_shard_on_tmpfs_opens_and_reads_whatever_the_probe_answers(memory_path):
    write_byte_shard(memory_path / "shard", 50_000)
    for _ in range(3):
        with varstore.open(memory_path / "shard") as reader:
            assert len(reader) == 50_000 and reader[-1] == b"\0" and reader[25_000] == b"\0"


def open_mostly_cold(shard: Path, index: Path, data: Path, monkeypatch) -> int:
    """Open the shard with only the page of its index's middle byte cached (checked with mincore: the middle byte
    cached, the last one not, what `looks_cached` probes; under 5% of the index resident); the bytes advised."""
    size = index.stat().st_size

    def establish() -> None:
        evict(data)
        cache_only_the_page_at(index, size // 2)
        pages = resident_pages(index)
        assert pages[(size // 2) // mmap.PAGESIZE] and not pages[-1]
        assert resident_fraction(index) < 0.05

    def open_shard() -> None:
        with varstore.open(shard):
            pass

    return sum(length for _, _, length, _ in open_as_probed(open_shard, establish, monkeypatch))


@needs_mincore
def test_a_mostly_cold_index_without_checksums_is_advised(tmp_path, monkeypatch):
    """The open reads the last offset, the index's last bytes: it must judge the index before that read."""
    index, data = write_byte_shard(tmp_path / "shard", 400_000, checksums=False)
    assert open_mostly_cold(tmp_path / "shard", index, data, monkeypatch) == index.stat().st_size


@needs_mincore
def test_a_mostly_cold_index_with_checksums_is_advised(tmp_path, monkeypatch):
    """The same attack with checksums: the last byte lies in the checksums, which the open does not read."""
    index, data = write_byte_shard(tmp_path / "shard", 400_000, checksums=True)
    assert open_mostly_cold(tmp_path / "shard", index, data, monkeypatch) == index.stat().st_size


def _open_and_read_many_times(path: str) -> int:
    total = 0
    for _ in range(20):
        with varstore.open(path) as reader:
            total += len(reader[len(reader) - 1]) + len(reader[len(reader) // 2])
    return total


@pytest.mark.timeout(WORKER_TEST_TIMEOUT)
@pytest.mark.skipif(not LINUX, reason="fork")
def test_many_processes_opening_the_same_cold_shard_at_once_all_succeed(tmp_path):
    index, data = write_byte_shard(tmp_path / "shard", 100_000)
    with contextlib.suppress(Exception):
        for path in (index, data):
            fd = os.open(path, os.O_RDONLY)
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)
    context = multiprocessing.get_context("fork")
    with concurrent.futures.ProcessPoolExecutor(max_workers=4, mp_context=context) as pool:
        results = list(pool.map(_open_and_read_many_times, [str(tmp_path / "shard")] * 8, timeout=WORKER_SAFETY_NET_S))
    assert results == [40] * 8


def test_many_threads_opening_the_same_shard_at_once_all_succeed(tmp_path):
    write_byte_shard(tmp_path / "shard", 20_000)
    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(_open_and_read_many_times, [str(tmp_path / "shard")] * 16))
    assert results == [40] * 16


# ======================================================================================================
# 2. msgpack array headers decoded before: `_unpack_array` against `_parse_array`
# ======================================================================================================


def extension(name: bytes, shape: tuple[int, ...], body: bytes, *, ndim: int | None = None) -> bytes:
    """The data of an array extension (not msgpack-framed): name length, name, ndim, shape, body."""
    ndim = len(shape) if ndim is None else ndim
    return bytes([len(name)]) + name + bytes([ndim]) + struct.pack(f"<{len(shape)}Q", *shape) + body


def outcome(function: Callable[[bytes], np.ndarray], data: bytes) -> tuple:
    try:
        array = function(data)
    except Exception as error:  # noqa: BLE001 - the exact exception is what is compared
        return ("error", type(error), str(error))
    return ("array", array.dtype.str, array.shape, array.tobytes(), array.flags.writeable, array.flags.c_contiguous,
            array.strides)


@pytest.fixture
def clean_headers():
    saved = dict(codecs_module._ARRAY_HEADERS)
    codecs_module._ARRAY_HEADERS.clear()
    yield codecs_module._ARRAY_HEADERS
    codecs_module._ARRAY_HEADERS.clear()
    codecs_module._ARRAY_HEADERS.update(saved)


NON_BOOL_DTYPES = [name for name in ALLOWED_DTYPES if name != "|b1"]
SHAPES = [(1,), (4,), (2, 2), (4, 1), (1, 4), (2, 1, 2), (3,)]


def valid_payloads() -> list[bytes]:
    payloads = []
    for name, shape in itertools.product(NON_BOOL_DTYPES, SHAPES):
        size = int(np.prod(shape)) * np.dtype(name).itemsize
        payloads.append(extension(name.encode(), shape, bytes(range(size % 256)) + bytes(max(0, size - size % 256))))
    return payloads


def mutations(payload: bytes, rng: random.Random) -> list[bytes]:
    header_end = 2 + payload[0] + 8 * payload[1 + payload[0]]
    forged = [payload[:cut] for cut in range(len(payload) + 1)]  # every truncation
    forged += [payload + bytes(extra) for extra in (1, 2, 4, 8, 16)]
    for position in range(header_end):
        for value in {0, 1, 2, 3, 31, 32, 255, (payload[position] + 1) % 256, (payload[position] - 1) % 256}:
            forged.append(payload[:position] + bytes([value]) + payload[position + 1 :])
    for _ in range(20):
        position = rng.randrange(len(payload))
        forged.append(payload[:position] + bytes([rng.randrange(256)]) + payload[position + 1 :])
    return forged


def test_cached_and_uncached_decoding_agree_on_every_forged_extension(clean_headers):
    rng = random.Random(15)
    checked = 0
    for payload in valid_payloads():
        assert outcome(codecs_module._unpack_array, payload)[0] == "array"  # its header is now known
        for forged in mutations(payload, rng):
            cached = outcome(codecs_module._unpack_array, forged)
            uncached = outcome(codecs_module._parse_array, forged)
            assert cached == uncached, (payload, forged)
            checked += 1
    assert checked > 5000


def test_cached_and_uncached_decoding_agree_on_random_bytes(clean_headers):
    rng = random.Random(1515)
    for payload in valid_payloads():
        codecs_module._unpack_array(payload)
    for _ in range(5000):
        length = rng.randrange(0, 48)
        head = rng.choice([b"", b"\x03<f4", b"\x03<i8\x01", b"\x03|u1\x02", b"\x02|u"])
        data = head + bytes(rng.randrange(256) for _ in range(length))
        assert outcome(codecs_module._unpack_array, data) == outcome(codecs_module._parse_array, data), data


def test_a_header_sharing_a_cached_prefix_but_another_ndim_or_shape_is_parsed_on_its_own(clean_headers):
    known = extension(b"<f4", (4,), bytes(16))
    codecs_module._unpack_array(known)
    as_matrix = extension(b"<f4", (2, 2), bytes(16))  # first 5 bytes equal the known header's
    as_column = extension(b"<f4", (4, 1), bytes(16))
    wrong_ndim = extension(b"<f4", (4,), bytes(16), ndim=2)  # claims 2 dims, holds 1: the body is read as a shape
    assert codecs_module._unpack_array(as_matrix).shape == (2, 2)
    assert codecs_module._unpack_array(as_column).shape == (4, 1)
    with pytest.raises(ValueError) as cached:
        codecs_module._unpack_array(wrong_ndim)
    with pytest.raises(ValueError) as uncached:
        codecs_module._parse_array(wrong_ndim)
    assert str(cached.value) == str(uncached.value)
    assert codecs_module._unpack_array(known).shape == (4,)


@pytest.mark.parametrize("body", [0, 4, 12, 15, 17, 20, 32])
def test_a_known_header_with_a_body_of_any_other_size_raises_as_the_uncached_path(clean_headers, body):
    codecs_module._unpack_array(extension(b"<f4", (4,), bytes(16)))
    forged = extension(b"<f4", (4,), bytes(body))
    assert outcome(codecs_module._unpack_array, forged) == outcome(codecs_module._parse_array, forged)
    assert outcome(codecs_module._unpack_array, forged)[0] == "error"


@pytest.mark.parametrize(
    "data",
    [b"", b"\x00", b"\x03", b"\x03<f4", b"\x03<f4\xff", b"\x03<f4\x20", b"\xff" * 3, b"\x03<f4\x01\x04",
     b"\x03<f4\x01" + bytes(7), b"\x03<f4\x00\x00\x00\x80?"],
)
def test_truncated_or_malformed_extensions_raise_the_same_with_a_warm_cache(clean_headers, data):
    for payload in valid_payloads():
        codecs_module._unpack_array(payload)
    assert outcome(codecs_module._unpack_array, data) == outcome(codecs_module._parse_array, data)


def test_bool_and_empty_and_0d_arrays_are_never_kept(clean_headers):
    for data in (extension(b"|b1", (3,), b"\x00\x01\x01"), extension(b"<f4", (0,), b""), extension(b"<f4", (2, 0), b""),
                 extension(b"<f4", (), bytes(4))):
        codecs_module._unpack_array(data)
        codecs_module._unpack_array(data)
    assert clean_headers == {}
    with pytest.raises(ValueError, match="byte 2"):
        codecs_module._unpack_array(extension(b"|b1", (3,), b"\x00\x02\x01"))


def test_kept_headers_are_small_bytes_and_never_pin_a_payload(clean_headers):
    payload = extension(b"<f8", (1 << 17,), bytes(1 << 20))  # 1 MiB body
    baseline = sys.getrefcount(payload)
    array = codecs_module._unpack_array(payload)
    array = codecs_module._unpack_array(payload)  # the cached path
    del array
    assert sys.getrefcount(payload) == baseline
    (key,) = clean_headers
    assert type(key) is bytes and len(key) == 2 + 3 + 8


def test_the_cache_is_cleared_at_its_limit_and_decodes_right_on_both_sides_of_the_clear(clean_headers):
    kept = codecs_module._ARRAY_HEADERS_KEPT
    payloads = [extension(b"|u1", (rows,), bytes([rows % 256]) * rows) for rows in range(1, kept + 3)]
    for round_ in range(3):
        for rows, payload in enumerate(payloads, 1):
            array = codecs_module._unpack_array(payload)
            assert array.shape == (rows,) and int(array[0]) == rows % 256
            assert len(clean_headers) <= kept


def test_threads_decoding_while_the_cache_is_cleared_get_the_right_arrays(clean_headers):
    kept = codecs_module._ARRAY_HEADERS_KEPT
    shapes = [(rows, 2) for rows in range(1, kept + 40)]  # more headers than kept: the cache is cleared again and again
    payloads = [extension(b"<i4", shape, np.full(shape, shape[0], np.int32).tobytes()) for shape in shapes]
    errors: list[BaseException] = []
    sizes: list[int] = []
    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)

    def work(seed: int) -> None:
        rng = random.Random(seed)
        try:
            for _ in range(3000):
                number = rng.randrange(len(payloads))
                array = codecs_module._unpack_array(payloads[number])
                assert array.shape == shapes[number] and int(array[0, 0]) == shapes[number][0]
                sizes.append(len(clean_headers))
        except BaseException as error:  # noqa: BLE001
            errors.append(error)

    try:
        threads = [threading.Thread(target=work, args=(seed,)) for seed in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(previous)
    assert errors == []
    assert max(sizes) <= kept + len(threads)


def test_a_msgpack_record_decodes_the_same_cold_and_warm(clean_headers):
    codec = MsgpackCodec()
    record = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": [np.arange(6, dtype=np.float32).reshape(3, 2)],
              "c": np.arange(6, dtype=np.float32), "d": np.array([True, False])}
    payload = bytes(codec.encode(record))
    cold = codec.decode(payload, 0, len(payload))
    warm = codec.decode(payload, 0, len(payload))
    for got in (cold, warm):
        assert got["a"].shape == (2, 3) and got["b"][0].shape == (3, 2) and got["c"].shape == (6,)
        assert np.array_equal(got["a"], record["a"]) and np.array_equal(got["b"][0], record["b"][0])
        assert got["d"].tolist() == [True, False] and not got["a"].flags.writeable


def test_a_forged_record_behind_a_known_header_is_refused_through_the_codec_as_when_cold(clean_headers):
    codec = MsgpackCodec()
    forged = msgpack.packb({"x": msgpack.ExtType(1, extension(b"<f4", (4,), bytes(12)))})
    with pytest.raises(ValueError) as cold:
        codec.decode(forged, 0, len(forged))
    good = bytes(codec.encode({"x": np.zeros(4, np.float32)}))
    assert codec.decode(good, 0, len(good))["x"].shape == (4,)  # the header is now known
    with pytest.raises(ValueError) as warm:
        codec.decode(forged, 0, len(forged))
    assert str(warm.value) == str(cold.value) and "does not match its 12 bytes" in str(warm.value)


# ======================================================================================================
# 3. A batch of ndarray records becomes tensors with one conversion
# ======================================================================================================


def write_sharded(path: Path, dtype: str, trailing: tuple[int, ...], records: list[np.ndarray], per_shard: int) -> None:
    with varstore.ShardedWriter(path, codec="ndarray", dtype=dtype, shape=trailing, max_shard_records=per_shard) as writer:
        for record in records:
            writer.append(record)


def records_of(dtype: str, trailing: tuple[int, ...], lengths: list[int], seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    kind = np.dtype(dtype).kind
    out = []
    for length in lengths:
        shape = (length, *trailing)
        if kind == "b":
            out.append(rng.integers(0, 2, shape).astype(bool))
        elif kind == "c":
            out.append((rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype))
        elif kind == "f":
            out.append(rng.standard_normal(shape).astype(dtype))
        elif dtype == "<u8":
            out.append(rng.integers(0, 2**63 - 1, shape, dtype=np.uint64))
        else:
            info = np.iinfo(dtype)
            out.append(rng.integers(info.min, info.max, shape, endpoint=True).astype(dtype))
    return out


def assert_same_sample(got: torch.Tensor, alone: torch.Tensor) -> None:
    assert type(got) is torch.Tensor
    assert got.dtype == alone.dtype and got.shape == alone.shape
    assert got.numpy().tobytes() == alone.numpy().tobytes()
    assert got.is_contiguous() and not got.requires_grad


@pytest.mark.parametrize(
    "dtype, trailing",
    [("|b1", ()), ("|i1", (2,)), ("<u2", ()), ("<i4", (1, 3)), ("<u8", (2,)), ("<f2", ()), ("<c8", (2,)), ("<f8", ())],
)
@pytest.mark.parametrize("keep_dtype", [False, True])
def test_a_batch_across_shards_with_negative_and_numpy_indices_holds_what_single_reads_give(tmp_path, dtype, trailing,
                                                                                             keep_dtype):
    lengths = [3, 0, 1, 5, 0, 0, 2, 4, 1]
    records = records_of(dtype, trailing, lengths)
    write_sharded(tmp_path / "data", dtype, trailing, records, per_shard=2)
    dataset = RecordDataset(tmp_path / "data", keep_dtype=keep_dtype)
    count = len(records)
    for indices in ([0, 1, 2], [-1, 0, -9, 4, 4, 8], np.array([8, 7, -2, 1], np.int32), np.array([5, 3], np.uint64),
                    range(count), [1], [4, 5], np.array([-3, -3], np.int8)):
        batch = dataset.__getitems__(indices)
        listed = [int(index) for index in np.asarray(indices).tolist()]
        assert len(batch) == len(listed)
        for index, sample in zip(listed, batch):
            assert_same_sample(sample, dataset[index])
            assert sample.numpy().astype(records[index].dtype).tobytes() == records[index].tobytes()


def test_an_empty_batch_is_an_empty_list(tmp_path):
    write_sharded(tmp_path / "data", "<i4", (), records_of("<i4", (), [2, 3]), per_shard=1)
    assert RecordDataset(tmp_path / "data").__getitems__([]) == []


def test_a_batch_of_only_empty_records_keeps_their_trailing_shape(tmp_path):
    write_sharded(tmp_path / "data", "<i2", (3, 2), [np.zeros((0, 3, 2), np.int16)] * 3, per_shard=2)
    dataset = RecordDataset(tmp_path / "data")
    batch = dataset.__getitems__([0, 2, 1])
    assert [sample.shape for sample in batch] == [(0, 3, 2)] * 3 and batch[0].dtype == torch.int64


def huge_uint64_dataset(path: Path) -> tuple[RecordDataset, int]:
    """Shards of 2 uint64 records of trailing shape (3,); the record returned holds 2**63 in its last element,
    and empty records sit before and after it."""
    records = [np.arange(6, dtype=np.uint64).reshape(2, 3), np.zeros((0, 3), np.uint64), np.ones((1, 3), np.uint64),
               np.zeros((0, 3), np.uint64), np.array([[1, 2, 3], [4, 5, 2**63]], np.uint64), np.zeros((0, 3), np.uint64),
               np.full((2, 3), 7, np.uint64)]
    write_sharded(path, "<u8", (3,), records, per_shard=2)
    return RecordDataset(path), 4


@pytest.mark.parametrize("position", ["first", "middle", "last"])
def test_a_uint64_value_over_int64_names_the_same_record_in_a_batch_as_alone(tmp_path, position):
    dataset, huge = huge_uint64_dataset(tmp_path / "data")
    with pytest.raises(varstore.RecordTypeError) as alone:
        dataset[huge]
    with pytest.raises(varstore.RecordTypeError) as alone_negative:
        dataset[huge - len(dataset)]
    assert str(alone.value) == str(alone_negative.value)
    assert f"record {huge} holds uint64 value {2**63}" in str(alone.value)
    others = [0, 1, -1, 3, 5]
    indices = {"first": [huge - len(dataset), *others], "middle": [0, 1, 3, np.int64(huge), 5, 6],
               "last": [*others, huge]}[position]
    with pytest.raises(varstore.RecordTypeError) as batch:
        dataset.__getitems__(np.array([int(index) for index in indices]))
    assert str(batch.value) == str(alone.value)
    assert [sample.shape[0] for sample in dataset.__getitems__(others)] == [2, 0, 2, 0, 0]


def test_the_first_of_two_huge_uint64_records_in_batch_order_is_named(tmp_path):
    records = [np.array([2**63 + 1], np.uint64), np.array([1], np.uint64), np.array([2**64 - 1], np.uint64)]
    write_sharded(tmp_path / "data", "<u8", (), records, per_shard=2)
    dataset = RecordDataset(tmp_path / "data")
    with pytest.raises(varstore.RecordTypeError, match=f"record 2 holds uint64 value {2**64 - 1}"):
        dataset.__getitems__([1, 2, 0])
    with pytest.raises(varstore.RecordTypeError, match=f"record 0 holds uint64 value {2**63 + 1}"):
        dataset.__getitems__([-3, 2])
    kept = RecordDataset(tmp_path / "data", keep_dtype=True).__getitems__([2, 0])
    assert kept[0].dtype == torch.uint64 and int(kept[0].numpy()[0]) == 2**64 - 1


def damage_record(directory: Path, index: int) -> str:
    with varstore.open(directory) as dataset:
        position = int(np.searchsorted(dataset.shard_starts, index, side="right") - 1)
        shard = dataset.shard(position)
        start = int(shard.offsets[index - int(dataset.shard_starts[position])])
        data_path, shard_path = shard.data_path, shard.path
    with open(data_path, "r+b") as file:
        file.seek(start)
        byte = file.read(1)
        file.seek(start)
        file.write(bytes([byte[0] ^ 0x40]))
    return shard_path


def test_skip_with_damaged_records_and_a_huge_uint64_names_the_huge_one_as_alone(tmp_path):
    """Shards of 1200 records of 16 bytes (damage away from the checked first/last 4 KiB): record 600 is damaged,
    record 1800 holds 2**63 + 9."""
    records = [np.full(2, index, np.uint64) for index in range(2400)]
    records[1800] = np.array([3, 2**63 + 9], np.uint64)
    with varstore.ShardedWriter(tmp_path / "data", codec="ndarray", dtype="<u8", max_shard_records=1200) as writer:
        writer.extend(records)
    damage_record(tmp_path / "data", 600)
    dataset = RecordDataset(tmp_path / "data", verify_reads=True, on_damaged="skip")
    with pytest.raises(varstore.RecordTypeError) as alone:
        dataset[1800]
    with pytest.raises(varstore.RecordTypeError) as batch:
        dataset.__getitems__([0, 600, 2, -600, 6])
    assert str(batch.value) == str(alone.value) and "record 1800 holds" in str(alone.value)
    batch = dataset.__getitems__([7, 600, 0, -2, 1799])
    assert [int(sample[0]) for sample in batch] == [7, 0, 2398, 1799]
    assert all(sample.dtype == torch.int64 for sample in batch)
    assert dataset.skipped_records == {dataset.reader.shard_paths[0]: 2}
    raising = RecordDataset(tmp_path / "data", verify_reads=True)
    with pytest.raises(varstore.CorruptRecordError, match="record 600"):
        raising.__getitems__([0, 600, 1800])


def test_skip_leaves_out_damaged_bool_records_and_keeps_the_rest_exact(tmp_path):
    records = [np.array([index % 2 == 0, True, index % 3 == 0]) for index in range(8000)]
    with varstore.ShardedWriter(tmp_path / "data", codec="ndarray", dtype="|b1", max_shard_records=4000) as writer:
        writer.extend(records)
    damage_record(tmp_path / "data", 6001)  # 0x01 ^ 0x40: an invalid |b1 byte, refused even without verify_reads
    dataset = RecordDataset(tmp_path / "data", on_damaged="skip")
    batch = dataset.__getitems__([6002, 6001, 3, 0, -1])
    assert [sample.tolist() for sample in batch] == [records[index].tolist() for index in (6002, 3, 0, 7999)]
    assert all(sample.dtype == torch.bool for sample in batch)
    with pytest.raises(varstore.CorruptRecordError):
        RecordDataset(tmp_path / "data").__getitems__([6002, 6001])


def test_mutating_one_sample_in_place_changes_no_other_sample_the_map_or_a_reread(tmp_path):
    records = records_of("<f4", (2,), [3, 2, 4])
    write_sharded(tmp_path / "data", "<f4", (2,), records, per_shard=2)
    dataset = RecordDataset(tmp_path / "data")
    first, again, second, third = dataset.__getitems__([0, 0, 1, 2])
    first.add_(1000)
    third.zero_()
    assert np.array_equal(again.numpy(), records[0]) and np.array_equal(second.numpy(), records[1])
    assert np.array_equal(dataset[0].numpy(), records[0]) and np.array_equal(dataset[2].numpy(), records[2])
    assert np.array_equal(dataset.__getitems__([0])[0].numpy(), records[0])


def _add_one_in_place(sample: torch.Tensor) -> torch.Tensor:
    return sample.add_(1)


def test_a_transform_mutating_its_sample_in_place_touches_only_that_sample(tmp_path):
    write_sharded(tmp_path / "data", "<i4", (), [np.arange(3, dtype=np.int32), np.arange(2, dtype=np.int32)], per_shard=1)
    dataset = RecordDataset(tmp_path / "data", transform=_add_one_in_place)
    assert [sample.tolist() for sample in dataset.__getitems__([0, 0, 1, 0])] == [[1, 2, 3], [1, 2, 3], [1, 2], [1, 2, 3]]
    assert dataset[0].tolist() == [1, 2, 3]


def test_an_in_place_change_to_one_sample_does_not_break_autograd_through_another(tmp_path):
    write_sharded(tmp_path / "data", "<f4", (), [np.ones(3, np.float32), np.full(2, 2, np.float32)], per_shard=2)
    first, second = RecordDataset(tmp_path / "data").__getitems__([0, 1])
    weight = torch.ones(2, requires_grad=True)
    loss = (weight * second).sum()  # saves `second` for backward
    first.mul_(2)  # another sample, changed in place
    loss.backward()
    assert weight.grad.tolist() == [2.0, 2.0]


def test_saving_one_sample_of_a_batch_writes_only_that_sample(tmp_path):
    records = [np.full(1000, index, np.int64) for index in range(64)]
    write_sharded(tmp_path / "data", "<i8", (), records, per_shard=64)
    dataset = RecordDataset(tmp_path / "data")
    alone, in_batch = io.BytesIO(), io.BytesIO()
    torch.save(dataset[3], alone)
    torch.save(dataset.__getitems__(range(64))[3], in_batch)
    assert len(in_batch.getvalue()) < 2 * len(alone.getvalue())


def _negate(sample: torch.Tensor) -> torch.Tensor:
    return torch.neg(sample)


def _as_list(batch: list) -> list:
    return batch


@pytest.mark.timeout(WORKER_TEST_TIMEOUT)
@pytest.mark.parametrize(("context", "workers"), [("fork", 2), ("spawn", 1)])  # a spawn worker costs a few seconds
def test_dataloader_workers_give_what_single_reads_give(tmp_path, context, workers):
    lengths = [index % 5 for index in range(40)]
    records = records_of("<i4", (2,), lengths, seed=3)
    write_sharded(tmp_path / "data", "<i4", (2,), records, per_shard=7)
    dataset = RecordDataset(tmp_path / "data", transform=_negate)
    loader = DataLoader(dataset, batch_size=6, num_workers=workers, multiprocessing_context=context,
                        timeout=WORKER_SAFETY_NET_S, collate_fn=collate_jagged, sampler=list(range(39, -1, -1)))
    seen = []
    for batch in loader:
        assert batch.values.dtype == torch.int64
        offsets = batch.offsets.tolist()
        seen += [batch.values[start:stop] for start, stop in zip(offsets, offsets[1:])]
    assert len(seen) == 40
    for index, sample in zip(range(39, -1, -1), seen):
        assert np.array_equal(sample.numpy(), -records[index].astype(np.int64))
    if context == "fork":
        lists = DataLoader(dataset, batch_size=5, num_workers=workers, multiprocessing_context=context,
                           timeout=WORKER_SAFETY_NET_S, collate_fn=_as_list)
        for number, batch in enumerate(lists):
            for offset, sample in enumerate(batch):
                assert np.array_equal(sample.numpy(), -records[5 * number + offset].astype(np.int64))


def test_numpy_output_and_flat_batches_are_untouched_by_the_batch_conversion(tmp_path):
    records = records_of("<u2", (), [2, 0, 3])
    write_sharded(tmp_path / "data", "<u2", (), records, per_shard=2)
    numpy_batch = RecordDataset(tmp_path / "data", output="numpy").__getitems__([2, 0])
    assert all(isinstance(sample, np.ndarray) and not sample.flags.writeable for sample in numpy_batch)
    assert numpy_batch[0].dtype == np.uint16
    flat = RecordDataset(tmp_path / "data", flat_batches=True).__getitems__([2, 1, 0])
    assert flat.values.tolist() == [*records[2].tolist(), *records[0].tolist()] and flat.offsets.tolist() == [0, 3, 3, 5]


# ======================================================================================================
# 4. Tensor samples concatenated with one torch.cat (`_flat_tensors`) against the per-sample path
# ======================================================================================================


def old_path():
    """The per-sample path: `_flat_tensors` declines every batch."""
    return _patched(collate_module, "_flat_tensors", lambda samples: None)


@contextlib.contextmanager
def _patched(module: Any, name: str, value: Any):
    original = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, original)


def collated(function: Callable[[Any], Any], batch: Any) -> tuple:
    try:
        result = function(batch)
    except Exception as error:  # noqa: BLE001
        return ("error", type(error), str(error))
    parts = [result[key] for key in sorted(result)] if isinstance(result, dict) else [result]
    described = []
    for part in parts:
        if not isinstance(part, tuple):
            described.append(("other", repr(part)))
            continue
        for tensor in part:
            raw = b"" if tensor.numel() == 0 else tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
            described.append((tensor.dtype, tuple(tensor.shape), raw, tensor.requires_grad))
    return ("ok", type(parts[0]).__name__, described)


def both_paths(batch: Any, function: Callable[[Any], Any]) -> tuple[tuple, tuple]:
    new = collated(function, batch)
    with old_path():
        old = collated(function, batch)
    return new, old


_x = torch.arange(12.0)
TENSOR_BATCHES = {
    "int32": [torch.arange(3, dtype=torch.int32), torch.arange(0, dtype=torch.int32), torch.arange(5, dtype=torch.int32)],
    "non-contiguous": [torch.arange(10.0).view(2, 5).t(), torch.arange(4.0).view(2, 2).t()[:, :2].contiguous().t()],
    "transposed 2-d": [torch.arange(10.0).view(2, 5).t(), torch.arange(6.0).view(2, 3).t()],
    "expanded": [torch.ones(1, 3).expand(4, 3), torch.zeros(2, 3)],
    "sliced with step": [torch.arange(20).view(10, 2)[::3], torch.arange(4).view(2, 2)],
    "sharing storage": [_x[:3], _x[2:9], _x, _x[11:]],
    "requires_grad": [torch.ones(3, requires_grad=True), torch.zeros(2), torch.full((1,), 2.0, requires_grad=True) * 3],
    "bfloat16": [torch.tensor([1.5, -2.0], dtype=torch.bfloat16), torch.tensor([3.0], dtype=torch.bfloat16)],
    "float16": [torch.tensor([1.5, -2.0], dtype=torch.float16), torch.tensor([], dtype=torch.float16)],
    "float8_e4m3fn": [torch.tensor([1.0, 2.0]).to(torch.float8_e4m3fn), torch.tensor([0.5]).to(torch.float8_e4m3fn)],
    "float8_e5m2": [torch.tensor([1.0, 2.0]).to(torch.float8_e5m2), torch.tensor([0.5]).to(torch.float8_e5m2)],
    "complex64": [torch.tensor([1 + 2j, 3 - 4j]), torch.tensor([5j])],
    "complex128 2-d": [torch.ones(2, 2, dtype=torch.complex128), torch.zeros(1, 2, dtype=torch.complex128)],
    "complex32": [torch.ones(2, dtype=torch.complex32), torch.zeros(3, dtype=torch.complex32)],
    "bool": [torch.tensor([True, False]), torch.tensor([], dtype=torch.bool), torch.tensor([True])],
    "uint64 over int64": [torch.tensor([2**63 + 5], dtype=torch.uint64), torch.tensor([1, 2], dtype=torch.uint64)],
    "uint16": [torch.tensor([65535], dtype=torch.uint16), torch.tensor([1, 2], dtype=torch.uint16)],
    "all empty": [torch.zeros(0), torch.zeros(0)],
    "empty with trailing": [torch.zeros(0, 3), torch.ones(2, 3), torch.zeros(0, 3)],
    "zero trailing": [torch.zeros(2, 0), torch.zeros(3, 0)],
    "channels_last": [torch.randn(2, 3, 4, 5).contiguous(memory_format=torch.channels_last),
                      torch.randn(1, 3, 4, 5).contiguous(memory_format=torch.channels_last)],
    "one sample": [torch.arange(4)],
    "mixed tensor then numpy": [torch.ones(2, dtype=torch.int32), np.ones(3, np.int32)],
    "mixed numpy then tensor": [np.ones(2, np.int32), torch.ones(3, dtype=torch.int32)],
    "mixed dtype": [torch.ones(2, dtype=torch.int32), torch.ones(3, dtype=torch.int64)],
    "bf16 then fp16": [torch.ones(2, dtype=torch.bfloat16), torch.ones(3, dtype=torch.float16)],
    "trailing mismatch": [torch.ones(2, 3), torch.ones(2, 4)],
    "1-d empty among 2-d": [torch.ones(2, 3), torch.zeros(0)],
    "scalar later": [torch.ones(2), torch.tensor(1.0)],
    "scalar first": [torch.tensor(1.0), torch.ones(2)],
    "meta device": [torch.ones(2), torch.ones(2, device="meta")],
    "parameter first": [torch.nn.Parameter(torch.ones(2)), torch.zeros(3)],
    "parameter later": [torch.zeros(3), torch.nn.Parameter(torch.ones(2))],
    "list later": [torch.ones(2), [1.0]],
    "dicts": [{"tokens": torch.arange(3), "label": 1}, {"tokens": torch.arange(1), "label": 0}],
    "nested dicts": [{"a": {"b": torch.ones(2, 2)}}, {"a": {"b": torch.zeros(1, 2)}}],
}
with torch.inference_mode():
    TENSOR_BATCHES["inference tensors"] = [torch.ones(3), torch.zeros(2)]


@pytest.mark.parametrize("name", sorted(TENSOR_BATCHES))
@pytest.mark.parametrize("how", ["jagged", "padded", "padded to 4 with 1", "padded with 300", "padded with -1.5",
                                 "jagged keep_dtype"])
def test_tensor_batches_collate_as_the_per_sample_path_does(name, how):
    function = {"jagged": collate_jagged, "padded": collate_padded,
                "padded to 4 with 1": lambda batch: collate_padded(batch, pad_value=1, pad_to_multiple=4),
                "padded with 300": lambda batch: collate_padded(batch, pad_value=300),
                "padded with -1.5": lambda batch: collate_padded(batch, pad_value=-1.5),
                "jagged keep_dtype": lambda batch: collate_jagged(batch, keep_dtype=True)}[how]
    new, old = both_paths(TENSOR_BATCHES[name], function)
    assert new == old


def test_a_jagged_batch_of_tensors_owns_its_values():
    samples = [torch.arange(3), torch.arange(2)]
    jagged = collate_jagged(samples)
    jagged.values.zero_()
    assert samples[0].tolist() == [0, 1, 2] and samples[1].tolist() == [0, 1]
    alone = [torch.arange(4.0)]
    single = collate_jagged(alone)
    single.values.fill_(9)
    assert alone[0].tolist() == [0.0, 1.0, 2.0, 3.0]


def test_collating_tensors_needing_grad_keeps_no_graph():
    leaf = torch.ones(3, requires_grad=True)
    jagged = collate_jagged([leaf * 2, leaf[:1]])
    assert jagged.values.grad_fn is None and not jagged.values.requires_grad
    padded = collate_padded([leaf * 2, leaf[:1]], pad_value=-1.0)
    assert padded.values.tolist() == [[2.0, 2.0, 2.0], [1.0, -1.0, -1.0]]


@pytest.mark.parametrize("bit", ["conj", "neg"])
def test_tensors_with_a_conj_or_neg_bit_collate_to_their_resolved_values(bit):
    base = torch.tensor([1 + 2j, 3 - 4j])
    lazy = base.conj() if bit == "conj" else base.conj().imag
    other = base if bit == "conj" else base.real
    jagged = collate_jagged([lazy, other])
    expected = torch.cat([lazy.resolve_conj().resolve_neg(), other])
    assert torch.equal(jagged.values, expected)
    assert not jagged.values.is_conj() and not jagged.values.is_neg()
    padded = collate_padded([other[:1], lazy])
    assert torch.equal(padded.values[1], lazy.resolve_conj().resolve_neg())


def test_a_conj_tensor_collates_next_to_a_numpy_sample():
    base = torch.tensor([1 + 2j, 3 - 4j])
    jagged = collate_jagged([base.conj(), np.array([5j], np.complex64)])
    assert jagged.values.tolist() == [1 - 2j, 3 + 4j, 5j]


def test_a_sparse_sample_fails_as_the_per_sample_path_fails():
    dense = torch.ones(2, 3)
    new, old = both_paths([dense, dense.to_sparse_csr()], collate_jagged)
    assert new[0] == old[0] == "error"
    assert new[1] is old[1]

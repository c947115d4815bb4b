"""The rules that make any file safe to open: bounded sizes, names that stay inside the dataset
directory, no blocking on special files, and decoding that never unpickles, evaluates or over-allocates."""

from __future__ import annotations

import builtins
import json
import os
import pickle
import signal
import struct
import tracemalloc

import msgpack
import numpy as np
import pytest

import varstore
from varstore.format import header as fmt
from varstore.format.manifest import MANIFEST_NAME, MAX_MANIFEST_SIZE, manifest_crc32c
from varstore.format.msgpack_bounds import MAX_DEPTH

from .helpers_reliability import exited_cleanly, read_shard_files, rewrite_header, with_metadata, write_shard_files

MSGPACK_CODEC_ID = 3


def msgpack_shard(prefix, payloads: list[bytes]) -> None:
    """A msgpack shard holding exactly `payloads`, valid or not: written as bytes, then relabelled."""
    with varstore.Writer(prefix) as writer:
        writer.extend(payloads)
    index, data = read_shard_files(prefix)
    write_shard_files(prefix, rewrite_header(index, codec=MSGPACK_CODEC_ID), data)


def array_extension(dtype: bytes, shape: tuple[int, ...], body: bytes) -> bytes:
    head = bytes([len(dtype)]) + dtype + bytes([len(shape)]) + struct.pack(f"<{len(shape)}Q", *shape)
    return msgpack.packb(msgpack.ExtType(1, head + body))


def traced_peak(operation) -> int:
    tracemalloc.start()
    try:
        operation()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


# -- names and special files ----------------------------------------------------------------------


@pytest.mark.parametrize("name", ["..", ".", "../outside", "/etc/passwd", "sub/shard", ".hidden", "", "a\x00b",
                                  "shard-000000.varstore-tmp-0123", "x" * 201, 7, None])
def test_manifest_shard_name_outside_the_directory_or_not_plain_is_refused(tmp_path, name):
    with varstore.ShardedWriter(tmp_path) as writer:
        writer.extend([b"a", b"b"])
    document = json.loads((tmp_path / MANIFEST_NAME).read_bytes())
    document["shards"][0]["name"] = name
    document["crc32c"] = manifest_crc32c(document)
    (tmp_path / MANIFEST_NAME).write_text(json.dumps(document))
    with pytest.raises(varstore.FormatError, match="plain file names"):
        varstore.open(tmp_path)
    if isinstance(name, str):
        with pytest.raises(varstore.FormatError, match="plain file name"):
            varstore.write_manifest(tmp_path, [name])


def test_shard_file_linked_to_a_file_outside_the_dataset_is_refused(tmp_path):
    with varstore.ShardedWriter(tmp_path / "data") as writer:
        writer.extend([b"inside"])
    with varstore.Writer(tmp_path / "outside") as writer:
        writer.append(b"secret")
    for suffix in (fmt.INDEX_SUFFIX, fmt.DATA_SUFFIX):
        os.replace(tmp_path / f"outside{suffix}", tmp_path / "data" / f"shard-000000{suffix}.target")
    index_path = tmp_path / "data" / f"shard-000000{fmt.INDEX_SUFFIX}"
    os.unlink(index_path)
    os.symlink(tmp_path / "data" / f"shard-000000{fmt.INDEX_SUFFIX}.target", index_path)
    with pytest.raises(varstore.VarstoreError, match="regular files"):
        list(varstore.open(tmp_path / "data"))


@pytest.mark.parametrize("planted", ["index", "data", "manifest"])
def test_fifo_in_place_of_a_file_is_refused_without_blocking(tmp_path, planted):
    with varstore.ShardedWriter(tmp_path) as writer:
        writer.extend([b"a"])
    target = {"index": "shard-000000.index", "data": "shard-000000.data", "manifest": MANIFEST_NAME}[planted]
    os.unlink(tmp_path / target)
    os.mkfifo(tmp_path / target)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child; the alarm turns a hang into a failure, not a stuck run
        signal.alarm(20)
        for path in [tmp_path] + ([tmp_path / "shard-000000"] if planted != "manifest" else []):
            try:
                varstore.open(path)
                os._exit(4)
            except varstore.FormatError:
                pass
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert exited_cleanly(status), f"opening with a FIFO as the {planted} file ended with status {status}"


def test_manifest_over_the_size_limit_is_refused_without_reading_it(tmp_path):
    with open(tmp_path / MANIFEST_NAME, "wb") as file:
        file.truncate(MAX_MANIFEST_SIZE + 1)  # sparse: costs no disk
    peak = traced_peak(lambda: pytest.raises(varstore.FormatError, varstore.open, tmp_path))
    assert peak < 1 << 20


def test_valid_manifest_is_read_without_allocating_the_size_limit(tmp_path):
    with varstore.ShardedWriter(tmp_path) as writer:
        writer.extend([b"a"])
    assert traced_peak(lambda: varstore.open(tmp_path).close()) < 1 << 20


def test_deeply_nested_metadata_json_is_a_format_error(tmp_path):
    with varstore.Writer(tmp_path / "docs") as writer:
        writer.append(b"a")
    index, data = read_shard_files(tmp_path / "docs")
    write_shard_files(tmp_path / "docs", with_metadata(index, b"[" * 200_000 + b"]" * 200_000), data)
    with pytest.raises(varstore.FormatError, match="not valid UTF-8 JSON"):
        varstore.open(tmp_path / "docs")


# -- msgpack records ------------------------------------------------------------------------------


@pytest.mark.parametrize("payload", [
    msgpack.packb(msgpack.ExtType(2, b"x")),
    msgpack.packb(msgpack.ExtType(127, b"")),
    b"\xc7\x03\x80abc",  # ext8 of type -128
    msgpack.packb(msgpack.Timestamp(1, 0)),  # ext -1: msgpack would decode it without asking the hook
    msgpack.packb([1, {"a": msgpack.ExtType(3, b"1234")}]),
    array_extension(b"|O", (1,), bytes(8)),  # object arrays would hold pointers: never
    array_extension(b">f4", (1,), bytes(4)),
    array_extension(b"<V8", (1,), bytes(8)),
    array_extension(b"<U1", (1,), bytes(4)),
    array_extension(b"<f4", (2,), bytes(4)),
    array_extension(b"<f4", (0, 2**63), b""),
    array_extension(b"<f4", (1,) * 32, bytes(4)),
    array_extension(b"<f4", (1,), bytes(4))[:-1],
    b"\xc1",
    b"",
    msgpack.packb(1) + msgpack.packb(2),
], ids=lambda payload: payload[:12].hex())
def test_msgpack_record_outside_the_format_is_a_corrupt_record(tmp_path, payload):
    msgpack_shard(tmp_path / "docs", [msgpack.packb("fine"), payload])
    with varstore.open(tmp_path / "docs") as store:
        assert store[0] == "fine"
        with pytest.raises(varstore.CorruptRecordError) as caught:
            store[1]
        assert caught.value.records == [1]
        with pytest.raises(varstore.CorruptRecordError):
            store.get_batch([0, 1])


@pytest.mark.parametrize("header", [b"\xdd\xff\xff\xff\xff", b"\xdc\xff\xff", b"\xdf\x7f\xff\xff\xff", b"\x9f"])
def test_msgpack_containers_promising_more_elements_than_bytes_are_refused_without_allocating(tmp_path, header):
    payload = header * 1000  # each level claims more elements than the whole record has bytes
    msgpack_shard(tmp_path / "docs", [payload])
    with varstore.open(tmp_path / "docs") as store:
        peak = traced_peak(lambda: pytest.raises(varstore.CorruptRecordError, store.__getitem__, 0))
    assert peak < 20 * len(payload) + (256 << 10)


def test_msgpack_nesting_is_capped_alike_for_writing_and_reading(tmp_path):
    def nested(depth: int) -> list:
        record: list = []
        for _ in range(depth - 1):
            record = [record]
        return record

    with varstore.Writer(tmp_path / "deepest", codec="msgpack") as writer:
        writer.append(nested(MAX_DEPTH))
        with pytest.raises(varstore.RecordTypeError, match="nest deeper"):
            writer.append(nested(MAX_DEPTH + 1))
    with varstore.open(tmp_path / "deepest") as store:
        assert store[0] == nested(MAX_DEPTH)
    msgpack_shard(tmp_path / "too-deep", [b"\x91" * (MAX_DEPTH + 1) + b"\xc0"])
    with varstore.open(tmp_path / "too-deep") as store:
        with pytest.raises(varstore.CorruptRecordError, match="nest deeper"):
            store[0]


@pytest.mark.parametrize("record", [msgpack.Timestamp(5, 0), {"when": msgpack.Timestamp(5, 0)}, msgpack.ExtType(9, b"")])
def test_writer_refuses_msgpack_records_that_readers_would_refuse(tmp_path, record):
    with pytest.raises(varstore.RecordTypeError, match="extension type"):
        varstore.Writer(tmp_path / "docs", codec="msgpack").append(record)


def test_reading_never_unpickles_or_evaluates(tmp_path, monkeypatch):
    class Exploit:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    pickled = pickle.dumps(Exploit())
    shards = {
        "bytes": ("bytes", {}, [pickled, b""]),
        "str": ("str", {}, ["text"]),
        "ndarray": ("ndarray", {"dtype": "float32", "shape": (2,)}, [np.ones((3, 2), np.float32)]),
        "msgpack": ("msgpack", {}, [{"pickle": pickled, "array": np.arange(3), "scalar": np.int64(4)}]),
    }
    for name, (codec, options, records) in shards.items():
        with varstore.Writer(tmp_path / name, codec=codec, **options) as writer:
            writer.extend(records)

    def forbidden(*args, **kwargs):
        raise AssertionError("varstore called pickle, eval or exec while reading")

    for module, attribute in ((pickle, "loads"), (pickle, "load"), (pickle, "Unpickler"), (builtins, "eval"),
                              (builtins, "exec"), (os, "system"), (np, "load")):
        monkeypatch.setattr(module, attribute, forbidden)
    for name in shards:
        with varstore.open(tmp_path / name, verify_reads=True) as store:
            store.verify()
            list(store), store.get_batch([0]), store.get_batch_flat([0])
    with varstore.open(tmp_path / "bytes") as store:
        assert store[0] == pickled

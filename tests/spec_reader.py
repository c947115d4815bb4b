"""A reader of varstore shards written from spec/FORMAT.md alone, with struct and mmap.

It imports nothing from varstore: if it reads the golden vectors, the spec is
complete enough to implement. Used by tests/test_spec_vectors.py.
"""

from __future__ import annotations

import json
import mmap
import os
import struct

import msgpack
import numpy as np

MAGIC = b"\x89VSI\r\n\x1a\n"
ALLOWED_DTYPES = {"|b1", "|i1", "|u1", "<i2", "<u2", "<i4", "<u4", "<i8", "<u8", "<f2", "<f4", "<f8", "<c8", "<c16"}


def _crc32c_table() -> list[int]:
    table = []
    for byte in range(256):
        value = byte
        for _ in range(8):
            value = (value >> 1) ^ 0x82F63B78 if value & 1 else value >> 1
        table.append(value)
    return table


_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    value = 0xFFFFFFFF
    for byte in data:
        value = _TABLE[(value ^ byte) & 0xFF] ^ (value >> 8)
    return value ^ 0xFFFFFFFF


class SpecError(Exception):
    pass


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise SpecError(message)


def _decode_array_extension(data: bytes) -> np.ndarray:
    k = data[0]
    dtype = data[1 : 1 + k].decode("ascii")
    _require(dtype in ALLOWED_DTYPES, f"dtype {dtype}")
    ndim = data[1 + k]
    _require(ndim <= 31, "ndim")
    shape = struct.unpack_from(f"<{ndim}Q", data, 2 + k)
    body = data[2 + k + 8 * ndim :]
    _require(int(np.prod(shape, dtype=object)) * np.dtype(dtype).itemsize == len(body), "array length")
    if not body:
        leading = shape[: shape.index(0)] if 0 in shape else shape
        _require(all(dim <= max(len(data), 1 << 16) for dim in leading), "empty array leading dimensions")
        _require(int(np.prod([dim or 1 for dim in shape], dtype=object)) <= 1 << 24, "empty array extent")
    return np.frombuffer(body, dtype).reshape(shape)


def _ext_hook(code: int, data: bytes) -> np.ndarray:
    _require(code == 1, f"extension type {code}")
    return _decode_array_extension(data)


def _map(pairs: list) -> dict:
    _require(all(type(key) in (str, int) for key, _ in pairs), "map keys are str or int")
    result = dict(pairs)
    _require(len(result) == len(pairs), "no map key twice")
    return result


def read_shard(prefix: str) -> dict:
    """Validate a shard as §1.3 says and return its header fields, metadata and decoded records."""
    with open(prefix + ".index", "rb") as index_file, open(prefix + ".data", "rb") as data_file:
        index = index_file.read()
        data_size_on_disk = os.fstat(data_file.fileno()).st_size
        data = mmap.mmap(data_file.fileno(), 0, access=mmap.ACCESS_READ) if data_size_on_disk else b""
        data = bytes(data)
    _require(len(index) >= 64 and index[:8] == MAGIC, "magic")
    major, minor, codec, reserved_byte, flags, count, data_size, metadata_size = struct.unpack_from("<HHBBHQQQ", index, 8)
    data_crc, edge_crc, body_crc = struct.unpack_from("<III", index, 40)
    (header_crc,) = struct.unpack_from("<I", index, 60)
    _require(major == 1, "major version")
    _require(header_crc == crc32c(index[:60]), "header crc")
    _require(reserved_byte == 0 and index[52:60] == bytes(8) and flags & ~1 == 0, "reserved/flags")
    _require(metadata_size <= 16 << 20 and data_size < 1 << 63, "sizes")
    offsets_start = (64 + metadata_size + 7) // 8 * 8
    per_record = 12 if flags & 1 else 8
    _require(count <= (len(index) - offsets_start - 8) // per_record, "record count")
    checksums_start = offsets_start + 8 * (count + 1)
    _require(len(index) == checksums_start + (4 * count if flags & 1 else 0), "index size")
    _require(index[64 + metadata_size : offsets_start] == bytes(offsets_start - 64 - metadata_size), "padding")
    metadata = json.loads(index[64 : 64 + metadata_size].decode("utf-8"))
    _require(isinstance(metadata.get("codec"), dict) and isinstance(metadata.get("user"), dict), "metadata")
    _require(len(data) == data_size, "data size")
    offsets = struct.unpack_from(f"<{count + 1}Q", index, offsets_start)
    _require(offsets[0] == 0 and offsets[-1] == data_size, "offset ends")
    _require(crc32c(data[:4096] + data[max(0, data_size - 4096) :]) == edge_crc, "edge crc")
    _require(crc32c(index[64:]) == body_crc and crc32c(data) == data_crc, "body/data crc")
    checksums = struct.unpack_from(f"<{count}I", index, checksums_start) if flags & 1 else None
    records = []
    for i in range(count):
        start, end = offsets[i], offsets[i + 1]
        _require(start <= end <= data_size, f"record {i} offsets")
        payload = data[start:end]
        if checksums is not None:
            _require(crc32c(payload) == checksums[i], f"record {i} checksum")
        records.append(_decode(codec, metadata["codec"], payload))
    return {
        "format_version": [major, minor],
        "codec": codec,
        "codec_params": metadata["codec"],
        "metadata": metadata["user"],
        "record_checksums": bool(flags & 1),
        "record_count": count,
        "data_size": data_size,
        "data_crc32c": data_crc,
        "records": records,
    }


def _decode(codec: int, params: dict, payload: bytes):
    if codec == 0:
        return payload
    if codec == 1:
        return payload.decode("utf-8")
    if codec == 2:
        dtype = np.dtype(params["dtype"])
        _require(params["dtype"] in ALLOWED_DTYPES, "dtype")
        row = dtype.itemsize * int(np.prod(params["shape"], dtype=np.int64))
        _require(len(payload) % row == 0, "whole rows")
        return np.frombuffer(payload, dtype).reshape(-1, *params["shape"])
    _require(codec == 3, f"codec id {codec}")
    return msgpack.unpackb(payload, raw=False, strict_map_key=False, ext_hook=_ext_hook, object_pairs_hook=_map)

"""Regenerate the dataset vectors and the damaged cases: ``python tools/make_vectors_datasets.py``.

- ``spec/vectors/datasets/NAME.json`` are written by hand and are the source of truth (codec, parameters,
  shard and manifest metadata, shard names, each shard's records in the §6 notation); this tool writes the
  dataset ``NAME/`` from each with varstore's `Writer` and `write_manifest`, never the descriptions.
- ``spec/vectors/damaged/NAME/`` is a small valid shard or dataset written by varstore, then changed by one
  named mutation (`SHARD_CASES`, `DATASET_CASES`) that breaks exactly one rule: every checksum that must stay
  valid is computed again. ``NAME.json`` says the rule, what changed, and when a reader must refuse it.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import msgpack
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import varstore  # noqa: E402
from varstore.format.checksum import crc32c
from varstore.format.manifest import manifest_crc32c
from tools.make_vectors import write_vector  # noqa: E402

VECTORS = ROOT / "spec" / "vectors"
DATASETS = VECTORS / "datasets"
DAMAGED = VECTORS / "damaged"


# -- dataset vectors ---------------------------------------------------------------------------


def write_dataset(directory: Path, description: dict[str, Any]) -> None:
    """Write the dataset a description describes: its shards with `Writer`, then its manifest with `write_manifest`."""
    for shard in description["shards"]:
        shard_description = {name: description[name] for name in ("codec", "codec_params", "record_checksums")}
        write_vector(directory / shard["name"], {**shard_description, "metadata": description["shard_metadata"], "records": shard["records"]})
    varstore.write_manifest(directory, [shard["name"] for shard in description["shards"]], metadata=description["metadata"])


def replace_directory(final: Path, build: Callable[[Path], None]) -> None:
    """Build a directory in a scratch place and put it at `final`, replacing what was there."""
    with tempfile.TemporaryDirectory(dir=final.parent) as scratch:
        built = Path(scratch) / "built"
        built.mkdir()
        build(built)
        if final.exists():
            shutil.rmtree(final)
        built.rename(final)


# -- shard surgery -----------------------------------------------------------------------------

_HEADER = struct.Struct("<8sHHBBHQQQIII8sI")
_FIELDS = ("magic", "major_version", "minor_version", "codec", "reserved", "flags", "record_count", "data_size",
           "metadata_size", "data_crc32c", "data_edge_crc32c", "body_crc32c", "reserved_tail", "header_crc32c")
_DERIVED = ("record_count", "data_size", "metadata_size", "data_crc32c", "data_edge_crc32c", "body_crc32c", "header_crc32c")


@dataclass
class Shard:
    """A shard taken apart: `pack` puts it together again with every derived field computed, except those in `keep`."""

    header: dict[str, Any]
    metadata: bytes
    offsets: list[int]
    checksums: list[int] | None
    data: bytes
    padding: bytes | None = None  # None: zeros up to the next multiple of 8
    tail: bytes = b""  # bytes after the last section
    keep: set[str] = field(default_factory=set)

    @classmethod
    def read(cls, prefix: Path) -> "Shard":
        index, data = prefix.with_suffix(".index").read_bytes(), prefix.with_suffix(".data").read_bytes()
        header = dict(zip(_FIELDS, _HEADER.unpack_from(index)))
        count, start = header["record_count"], (64 + header["metadata_size"] + 7) // 8 * 8
        offsets = list(struct.unpack_from(f"<{count + 1}Q", index, start))
        checksums = list(struct.unpack_from(f"<{count}I", index, start + 8 * (count + 1))) if header["flags"] & 1 else None
        return cls(header, index[64 : 64 + header["metadata_size"]], offsets, checksums, data)

    def set_records(self, payloads: list[bytes]) -> None:
        self.data = b"".join(payloads)
        self.offsets = [0]
        for payload in payloads:
            self.offsets.append(self.offsets[-1] + len(payload))
        if self.checksums is not None:
            self.checksums = [crc32c(payload) for payload in payloads]

    def set(self, **fields: Any) -> None:
        """Force header fields to these values (kept by `pack`)."""
        self.header.update(fields)
        self.keep.update(fields)

    def pack(self) -> tuple[bytes, bytes]:
        header, derived = dict(self.header), {}
        padding = self.padding if self.padding is not None else bytes(-(64 + len(self.metadata)) % 8)
        checksums = self.checksums
        if checksums is not None and "checksums" not in self.keep:
            checksums = [crc32c(self.data[start:end]) for start, end in zip(self.offsets, self.offsets[1:])]
        body = self.metadata + padding + struct.pack(f"<{len(self.offsets)}Q", *self.offsets)
        body += (struct.pack(f"<{len(checksums)}I", *checksums) if checksums is not None else b"") + self.tail
        edge = min(4096, len(self.data))
        derived = {
            "record_count": len(self.offsets) - 1,
            "data_size": len(self.data),
            "metadata_size": len(self.metadata),
            "data_crc32c": crc32c(self.data),
            "data_edge_crc32c": crc32c(self.data[len(self.data) - edge :], crc32c(self.data[:edge])),
            "body_crc32c": crc32c(body),
        }
        header.update({name: value for name, value in derived.items() if name not in self.keep})
        raw = _HEADER.pack(*(header[name] for name in _FIELDS))
        if "header_crc32c" not in self.keep:
            raw = raw[:60] + struct.pack("<I", crc32c(raw[:60]))
        return raw + body, self.data

    def write(self, prefix: Path) -> None:
        index, data = self.pack()
        prefix.with_suffix(".index").write_bytes(index)
        prefix.with_suffix(".data").write_bytes(data)


def base_shard(directory: Path, codec: str, records: list[Any], **options: Any) -> Shard:
    prefix = directory / f"base-{codec}-{len(list(directory.iterdir()))}"
    with varstore.Writer(prefix, codec=codec, **options) as writer:
        writer.extend(records)
    return Shard.read(prefix)


def bytes_shard(scratch: Path, checksums: bool = True) -> Shard:
    return base_shard(scratch, "bytes", [b"ab", b"cde"], checksums=checksums)


def msgpack_shard(scratch: Path, damaged_record: bytes) -> Shard:
    """A msgpack shard whose record 1 is `damaged_record` (record 0 is fine)."""
    shard = base_shard(scratch, "msgpack", [{"ok": 1}, {"ok": 2}])
    shard.set_records([msgpack.packb({"ok": 1}), damaged_record])
    return shard


def metadata_shard(scratch: Path, metadata: bytes) -> Shard:
    shard = bytes_shard(scratch)
    shard.metadata = metadata
    return shard


def u2_shard(scratch: Path) -> Shard:
    return base_shard(scratch, "ndarray", [np.array([1, 2], np.uint16), np.array([3], np.uint16)], dtype="<u2")


def array_extension(dtype: bytes, shape: tuple[int, ...], body: bytes = b"") -> bytes:
    data = bytes([len(dtype)]) + dtype + bytes([len(shape)]) + struct.pack(f"<{len(shape)}Q", *shape) + body
    return msgpack.packb(msgpack.ExtType(1, data))


# -- the damaged shard cases -------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    rule: str
    what: str
    refused_at: str  # "open", "read" or "verify"
    make: Callable[[Path], Any]  # scratch directory -> a Shard, or (index bytes, data bytes or None: no data file)
    record: int | None = None


def _with(shard: Shard, change: Callable[[Shard], Any]) -> Shard:
    change(shard)
    return shard


def _packed_then(shard: Shard, change_index: Callable[[bytes], bytes]) -> tuple[bytes, bytes]:
    index, data = shard.pack()
    return change_index(index), data


def _u2_with_records(scratch: Path, offsets: list[int], data: bytes) -> Shard:
    shard = u2_shard(scratch)
    shard.offsets, shard.data = offsets, data
    return shard


SHARD_CASES: dict[str, Case] = {
    # §1.3 at open, in order
    "index-shorter-than-header": Case("§1.3 step 1", "The index file is 63 bytes, shorter than the 64-byte header.", "open",
        lambda s: _packed_then(bytes_shard(s), lambda index: index[:63])),
    "magic-text-mode": Case("§1.3 step 1", "The magic's CR LF became LF (a text-mode transfer), header checksum recomputed.", "open",
        lambda s: _with(bytes_shard(s), lambda shard: shard.header.update(magic=b"\x89VSI\n\x1a\n\x00"))),
    "major-version-4": Case("§1.3 step 2", "major_version is 4 (2 and 3 are compressed shards, §1.6 and §1.7).", "open",
        lambda s: _with(bytes_shard(s), lambda shard: shard.set(major_version=4))),
    "header-crc32c-wrong": Case("§1.3 step 3", "header_crc32c has one bit flipped.", "open",
        lambda s: _with(bytes_shard(s), lambda shard: shard.set(header_crc32c=_correct(shard, "header_crc32c") ^ 1))),
    "reserved-byte-set": Case("§1.3 step 4", "The reserved byte at position 13 is 1.", "open",
        lambda s: _with(bytes_shard(s), lambda shard: shard.set(reserved=1))),
    "reserved-tail-set": Case("§1.3 step 4", "The reserved bytes [52, 60) are not zero.", "open",
        lambda s: _with(bytes_shard(s), lambda shard: shard.set(reserved_tail=b"\x00" * 7 + b"\x01"))),
    "unknown-flag": Case("§1.3 step 4", "flags has bit 1 set besides bit 0.", "open",
        lambda s: _with(bytes_shard(s), lambda shard: shard.set(flags=3))),
    "metadata-size-over-limit": Case("§1.3 step 5", "metadata_size is 16 MiB + 1 (the file is small).", "open",
        lambda s: _with(bytes_shard(s), lambda shard: shard.set(metadata_size=(16 << 20) + 1))),
    "data-size-2-to-63": Case("§1.3 step 5", "data_size is 2^63.", "open",
        lambda s: _with(bytes_shard(s), lambda shard: shard.set(data_size=1 << 63))),
    "index-ends-before-offsets": Case("§1.3 step 6", "metadata_size claims more than the index holds, so the file ends "
        "before offsets_start + 8 (index size - offsets_start - 8 would underflow).", "open",
        lambda s: _with(bytes_shard(s), lambda shard: shard.set(metadata_size=4000, record_count=0))),
    "record-count-too-large": Case("§1.3 step 6", "record_count is 2^61, which the index file cannot hold.", "open",
        lambda s: _with(bytes_shard(s), lambda shard: shard.set(record_count=1 << 61))),
    "index-one-byte-long": Case("§1.3 step 6", "The index file has one byte after its last section (body checksum covers it).", "open",
        lambda s: _with(bytes_shard(s), lambda shard: setattr(shard, "tail", b"\x00"))),
    "padding-not-zero": Case("§1.3 step 7", "A padding byte after the metadata is 0x20 (a space).", "open",
        lambda s: _with(bytes_shard(s), _space_padding)),
    "data-crc32c-member-other-value": Case("§1.3 step 7", 'The metadata member "data_crc32c" is "recorded" (its one value '
        'is "not recorded", §1.2); the header\'s data_crc32c is 0.', "open",
        lambda s: _with(metadata_shard(s, b'{"codec":{},"data_crc32c":"recorded","user":{}}'),
                        lambda shard: shard.set(data_crc32c=0))),
    "data-crc32c-not-recorded-but-nonzero": Case("§1.3 step 7", 'The metadata says "data_crc32c": "not recorded" but the '
        "header's data_crc32c is the data's CRC32C, not 0 (§1.2).", "open",
        lambda s: metadata_shard(s, b'{"codec":{},"data_crc32c":"not recorded","user":{}}')),
    "metadata-bom": Case("§1.4", "The metadata starts with a UTF-8 byte order mark.", "open",
        lambda s: metadata_shard(s, b'\xef\xbb\xbf{"codec":{},"user":{}}')),
    "metadata-nan": Case("§1.4", "The metadata holds NaN.", "open",
        lambda s: metadata_shard(s, b'{"codec":{},"user":{"x":NaN}}')),
    "metadata-infinity": Case("§1.4", "The metadata holds -Infinity.", "open",
        lambda s: metadata_shard(s, b'{"codec":{},"user":{"x":-Infinity}}')),
    "metadata-float-overflow": Case("§1.4", "The metadata holds 1e400, which overflows a 64-bit float.", "open",
        lambda s: metadata_shard(s, b'{"codec":{},"user":{"x":1e400}}')),
    "metadata-integer-2-to-64": Case("§1.4", "The metadata holds the integer 2^64, outside [-2^63, 2^64).", "open",
        lambda s: metadata_shard(s, b'{"codec":{},"user":{"x":18446744073709551616}}')),
    "metadata-integer-below-minus-2-to-63": Case("§1.4", "The metadata holds the integer -2^63 - 1.", "open",
        lambda s: metadata_shard(s, b'{"codec":{},"user":{"x":-9223372036854775809}}')),
    "metadata-duplicate-name": Case("§1.4", 'A nested object in "user" has the member "a" twice.', "open",
        lambda s: metadata_shard(s, b'{"codec":{},"user":{"x":{"a":1,"a":2}}}')),
    "metadata-lone-surrogate": Case("§1.4", "A string holds the escape \\ud800 with no low surrogate after it.", "open",
        lambda s: metadata_shard(s, b'{"codec":{},"user":{"x":"\\ud800"}}')),
    "metadata-depth-65": Case("§1.4", "Arrays and objects nest 65 deep (the outer object is 1).", "open",
        lambda s: metadata_shard(s, b'{"codec":{},"user":{"x":' + b"[" * 63 + b"]" * 63 + b"}}")),
    "metadata-invalid-utf8": Case("§1.4", "A string in the metadata holds the byte 0xff.", "open",
        lambda s: metadata_shard(s, b'{"codec":{},"user":{"x":"\xff"}}')),
    "metadata-without-user": Case("§1.4", 'The metadata object has no "user" member.', "open",
        lambda s: metadata_shard(s, b'{"codec":{}}')),
    "metadata-integer-4301-digits": Case("§1.4", "The metadata holds an integer of 4301 digits (far outside [-2^63, 2^64); "
        "more digits than CPython's int() converts by default).", "open",
        lambda s: metadata_shard(s, b'{"codec":{},"user":{"x":' + b"7" * 4301 + b"}}")),
    "codec-id-unknown": Case("§2", "The codec id is 4.", "open",
        lambda s: _with(bytes_shard(s), lambda shard: shard.set(codec=4))),
    "ndarray-shape-missing": Case("§2", 'The ndarray parameters lack "shape".', "open",
        lambda s: _with(u2_shard(s), lambda shard: setattr(shard, "metadata", b'{"codec":{"dtype":"<u2"},"user":{}}'))),
    "ndarray-params-unknown-member": Case("§2", 'The ndarray parameters have an unknown member "order".', "open",
        lambda s: _with(u2_shard(s), lambda shard: setattr(shard, "metadata", b'{"codec":{"dtype":"<u2","order":"C","shape":[]},"user":{}}'))),
    "bytes-with-ndarray-params": Case("§2", 'A bytes shard has the parameters {"dtype": "<u2", "shape": []}.', "open",
        lambda s: metadata_shard(s, b'{"codec":{"dtype":"<u2","shape":[]},"user":{}}')),
    "ndarray-dtype-not-a-string": Case("§2.1", 'The dtype is the JSON array ["<u2"], not a string.', "open",
        lambda s: _with(u2_shard(s), lambda shard: setattr(shard, "metadata", b'{"codec":{"dtype":["<u2"],"shape":[]},"user":{}}'))),
    "ndarray-dtype-big-endian": Case("§2.1", 'The dtype is ">u2".', "open",
        lambda s: _with(u2_shard(s), lambda shard: setattr(shard, "metadata", b'{"codec":{"dtype":">u2","shape":[]},"user":{}}'))),
    "ndarray-shape-zero": Case("§2.1", "The trailing shape is [0].", "open",
        lambda s: _with(u2_shard(s), lambda shard: setattr(shard, "metadata", b'{"codec":{"dtype":"<u2","shape":[0]},"user":{}}'))),
    "ndarray-shape-float-2-point-0": Case("§2.1", 'The trailing shape is [2.0], a float, not the integer 2.', "open",
        lambda s: _with(u2_shard(s), lambda shard: setattr(shard, "metadata", b'{"codec":{"dtype":"<u2","shape":[2.0]},"user":{}}'))),
    "ndarray-shape-float-2e0": Case("§2.1", 'The trailing shape is [2e0], a float (it has an exponent), not the integer 2.', "open",
        lambda s: _with(u2_shard(s), lambda shard: setattr(shard, "metadata", b'{"codec":{"dtype":"<u2","shape":[2e0]},"user":{}}'))),
    "ndarray-row-size-2-to-64": Case("§2.1", "A |u1 shard of no records has the trailing shape [65536, 65536, 65536, 65536]: "
        "its row is 2^64 bytes, 0 in wrapping 64-bit arithmetic.", "open",
        lambda s: _with(base_shard(s, "ndarray", [], dtype="|u1"), lambda shard: setattr(
            shard, "metadata", b'{"codec":{"dtype":"|u1","shape":[65536,65536,65536,65536]},"user":{}}'))),
    "data-file-one-byte-long": Case("§1.3 step 8", "The data file has one byte more than data_size.", "open",
        lambda s: _data_longer(bytes_shard(s))),
    "ndarray-data-not-whole-rows": Case("§1.3 step 8", "A <u2 shard's data file is 5 bytes (data_size and offsets[N] say 5 too).", "open",
        lambda s: _u2_with_records(s, [0, 4, 5], b"\x01\x00\x02\x00\x03")),
    "data-file-missing": Case("§1.3 step 8", "shard.data does not exist (shard.index is whole and valid).", "open",
        lambda s: (bytes_shard(s).pack()[0], None)),
    "first-offset-not-zero": Case("§1.3 step 9", "offsets[0] is 1.", "open",
        lambda s: _with(bytes_shard(s), lambda shard: shard.offsets.__setitem__(0, 1))),
    "last-offset-not-data-size": Case("§1.3 step 9", "offsets[N] is data_size - 1.", "open",
        lambda s: _with(bytes_shard(s), lambda shard: shard.offsets.__setitem__(-1, 4))),
    "data-edge-crc32c-wrong": Case("§1.3 step 10", "data_edge_crc32c has one bit flipped (the data file is another's).", "open",
        lambda s: _with(bytes_shard(s), lambda shard: shard.set(data_edge_crc32c=_correct(shard, "data_edge_crc32c") ^ 1))),
    # every read
    "offsets-reversed": Case("§1.3 read", "offsets are [0, 4, 2, 5]: record 1 ends before it starts.", "read",
        lambda s: _with(bytes_shard(s), lambda shard: setattr(shard, "offsets", [0, 4, 2, 5])), record=1),
    "offset-past-data": Case("§1.3 read", "offsets are [0, 9, 5]: record 0 ends past the 5-byte data file.", "read",
        lambda s: _with(bytes_shard(s), lambda shard: setattr(shard, "offsets", [0, 9, 5])), record=0),
    "ndarray-record-off-row": Case("§2.1", "A <u2 shard's offsets are [0, 3, 6]: record 0 is 1.5 rows.", "read",
        lambda s: _u2_with_records(s, [0, 3, 6], b"\x01\x00\x02\x00\x03\x00"), record=0),
    "bool-byte-2": Case("§2.1", "A |b1 record holds the byte 2.", "read",
        lambda s: _with(base_shard(s, "ndarray", [np.array([True, False])], dtype="|b1"), lambda shard: shard.set_records([b"\x01\x02"])), record=0),
    "str-invalid-utf8": Case("§2", "A str record is the bytes ff fe.", "read",
        lambda s: _with(base_shard(s, "str", ["ok", "fine"]), lambda shard: shard.set_records([b"ok", b"\xff\xfe"])), record=1),
    "msgpack-trailing-byte": Case("§2.2", "A msgpack record is two objects (nil, nil).", "read",
        lambda s: msgpack_shard(s, b"\xc0\xc0"), record=1),
    "msgpack-empty-record": Case("§2.2", "A msgpack record is 0 bytes.", "read", lambda s: msgpack_shard(s, b""), record=1),
    "msgpack-bin-key": Case("§2.2", "A map has a bin key.", "read", lambda s: msgpack_shard(s, b"\x81\xc4\x01k\x01"), record=1),
    "msgpack-nil-key": Case("§2.2", "A map has a nil key.", "read", lambda s: msgpack_shard(s, b"\x81\xc0\x01"), record=1),
    "msgpack-bool-key": Case("§2.2", "A map has the key true.", "read", lambda s: msgpack_shard(s, b"\x81\xc3\x01"), record=1),
    "msgpack-float-key": Case("§2.2", "A map has a float 64 key.", "read",
        lambda s: msgpack_shard(s, b"\x81\xcb" + struct.pack(">d", 1.0) + b"\x01"), record=1),
    "msgpack-duplicate-key": Case("§2.2", 'A map has the key "a" twice, as fixstr and as str 8.', "read",
        lambda s: msgpack_shard(s, b"\x82\xa1a\x01\xd9\x01a\x02"), record=1),
    "msgpack-duplicate-integer-key": Case("§2.2", "A map has the key 1 twice, as fixint and as uint 8.", "read",
        lambda s: msgpack_shard(s, b"\x82\x01\xc0\xcc\x01\xc0"), record=1),
    "msgpack-depth-513": Case("§2.2", "Arrays nest 513 deep.", "read", lambda s: msgpack_shard(s, b"\x91" * 512 + b"\x90"), record=1),
    "msgpack-container-claims-too-much": Case("§2.2", "An array 32 claims 2^32 - 1 elements in a 7-byte record.", "read",
        lambda s: msgpack_shard(s, b"\xdd\xff\xff\xff\xff\xc0\xc0"), record=1),
    "msgpack-never-used-byte": Case("§2.2", "A record is the byte c1, which MessagePack never uses.", "read",
        lambda s: msgpack_shard(s, b"\xc1"), record=1),
    "msgpack-str-invalid-utf8": Case("§2.2", "A str holds the byte ff.", "read", lambda s: msgpack_shard(s, b"\xa1\xff"), record=1),
    "msgpack-extension-type-2": Case("§2.2", "A record is extension type 2 (fixext 1).", "read",
        lambda s: msgpack_shard(s, b"\xd4\x02\x00"), record=1),
    "array-empty-shape-huge": Case("§2.2", "An array extension of shape [0, 2^64 - 1] (no bytes).", "read",
        lambda s: msgpack_shard(s, array_extension(b"<u2", (0, (1 << 64) - 1))), record=1),
    "array-empty-leading-dimension-huge": Case("§2.2", "An array extension of shape [2^17, 0]: a dimension before the first 0 "
        "exceeds 2^16.", "read", lambda s: msgpack_shard(s, array_extension(b"<u2", (1 << 17, 0))), record=1),
    "array-empty-leading-dimension-2-to-16-plus-1": Case("§2.2", "An array extension of shape [2^16 + 1, 0]: one past "
        "the inclusive bound on a dimension before the first 0.", "read",
        lambda s: msgpack_shard(s, array_extension(b"<u2", ((1 << 16) + 1, 0))), record=1),
    "array-empty-extent-2-to-24-plus-1": Case("§2.2", "An array extension of shape [0, 2^24 + 1]: its non-zero dimensions "
        "multiply to one past the inclusive bound.", "read",
        lambda s: msgpack_shard(s, array_extension(b"|u1", (0, (1 << 24) + 1))), record=1),
    "array-size-wraps-to-zero": Case("§2.2", "An array extension of shape [2^32, 2^32] and dtype |u1 holds no bytes: its "
        "2^64 elements are 0 in wrapping 64-bit arithmetic.", "read",
        lambda s: msgpack_shard(s, array_extension(b"|u1", (1 << 32, 1 << 32))), record=1),
    "array-length-mismatch": Case("§2.2", "An array extension of shape [2] with dtype <u2 holds 3 bytes.", "read",
        lambda s: msgpack_shard(s, array_extension(b"<u2", (2,), b"\x01\x00\x02")), record=1),
    "array-dtype-not-allowed": Case("§2.2", 'An array extension has the dtype "|O".', "read",
        lambda s: msgpack_shard(s, array_extension(b"|O", (0,))), record=1),
    "array-32-dimensions": Case("§2.2", "An array extension has 32 dimensions.", "read",
        lambda s: msgpack_shard(s, array_extension(b"|u1", (1,) * 32, b"\x00")), record=1),
    "array-bool-byte-2": Case("§2.2", "A |b1 array extension holds the byte 2.", "read",
        lambda s: msgpack_shard(s, array_extension(b"|b1", (2,), b"\x00\x02")), record=1),
    # full verification
    "body-crc32c-wrong": Case("§1.3 verify", "body_crc32c has one bit flipped (header checksum recomputed).", "verify",
        lambda s: _with(bytes_shard(s), lambda shard: shard.set(body_crc32c=_correct(shard, "body_crc32c") ^ 1))),
    "data-crc32c-wrong-with-record-checksums": Case("§1.3 verify", "data_crc32c has one bit flipped in a shard with record "
        "checksums, which are all correct.", "verify",
        lambda s: _with(bytes_shard(s), lambda shard: shard.set(data_crc32c=_correct(shard, "data_crc32c") ^ 1))),
    "data-crc32c-wrong-without-record-checksums": Case("§1.3 verify", "data_crc32c has one bit flipped in a shard without "
        "record checksums.", "verify",
        lambda s: _with(bytes_shard(s, checksums=False), lambda shard: shard.set(data_crc32c=_correct(shard, "data_crc32c") ^ 1))),
    "record-checksum-wrong": Case("§1.3 verify", "Record 1's checksum has one bit flipped (body checksum recomputed); reads "
        "may check it, verification must.", "verify",
        lambda s: _with(bytes_shard(s), _flip_record_checksum)),
}


def _correct(shard: Shard, name: str) -> int:
    """The value `pack` computes for header field `name` of `shard` as it is now."""
    index, _ = Shard(dict(shard.header), shard.metadata, shard.offsets, shard.checksums, shard.data, shard.padding, shard.tail, set(shard.keep)).pack()
    return dict(zip(_FIELDS, _HEADER.unpack_from(index)))[name]


def _space_padding(shard: Shard) -> None:
    width = -(64 + len(shard.metadata)) % 8
    assert width, "the base shard's metadata must leave padding"
    shard.padding = b" " + bytes(width - 1)


def _data_longer(shard: Shard) -> tuple[bytes, bytes]:
    index, data = shard.pack()
    return index, data + b"\x00"


def _flip_record_checksum(shard: Shard) -> None:
    shard.checksums = [crc32c(b"ab"), crc32c(b"cde") ^ 1]
    shard.keep.add("checksums")


# -- the damaged dataset cases -----------------------------------------------------------------

MANIFEST = "manifest.json"


def base_dataset(directory: Path) -> None:
    """A small valid str dataset: shard "a" holds one record, "b" none, "c" one (global record 1)."""
    for name, records in (("a", ["x"]), ("b", []), ("c", ["yz"])):
        with varstore.Writer(directory / name, codec="str") as writer:
            writer.extend(records)
    varstore.write_manifest(directory, ["a", "b", "c"], metadata={"licence": "CC0"})


def base_u2_dataset(directory: Path) -> None:
    """A small valid ndarray <u2 dataset: shard "a" holds one record, "b" none, "c" one (global record 1)."""
    for name, records in (("a", [np.array([1, 2], np.uint16)]), ("b", []), ("c", [np.array([3], np.uint16)])):
        with varstore.Writer(directory / name, codec="ndarray", dtype="<u2") as writer:
            writer.extend(records)
    varstore.write_manifest(directory, ["a", "b", "c"], metadata={"licence": "CC0"})


def load_manifest(directory: Path) -> dict[str, Any]:
    return json.loads((directory / MANIFEST).read_text(encoding="utf-8"))


def save_manifest(directory: Path, document: dict[str, Any], *, fix_crc32c: bool = True) -> None:
    """Write a changed manifest in varstore's spelling, its "crc32c" recomputed unless told not to."""
    if fix_crc32c:
        document["crc32c"] = manifest_crc32c({name: value for name, value in document.items() if name != "crc32c"})
    text = json.dumps(document, ensure_ascii=False, sort_keys=True, indent=1) + "\n"
    (directory / MANIFEST).write_text(text, encoding="utf-8")


def edit_manifest(change: Callable[[dict[str, Any]], Any], *, fix_crc32c: bool = True) -> Callable[[Path], None]:
    def mutate(directory: Path) -> None:
        document = load_manifest(directory)
        change(document)
        save_manifest(directory, document, fix_crc32c=fix_crc32c)

    return mutate


def edit_manifest_text(old: str, new: str) -> Callable[[Path], None]:
    def mutate(directory: Path) -> None:
        text = (directory / MANIFEST).read_text(encoding="utf-8")
        assert old in text, old
        (directory / MANIFEST).write_text(text.replace(old, new, 1), encoding="utf-8")

    return mutate


def entry(document: dict[str, Any], name: str) -> dict[str, Any]:
    return next(item for item in document["shards"] if item["name"] == name)


def symlink_to_moved(relative: str) -> Callable[[Path], None]:
    """Move a file to `relative`.real and leave a symbolic link to it in its place: same bytes, not a regular file."""

    def mutate(directory: Path) -> None:
        os.rename(directory / relative, directory / f"{relative}.real")
        os.symlink(f"{relative}.real", directory / relative)

    return mutate


def rewrite_shard(name: str, change: Callable[[Shard], Any]) -> Callable[[Path], None]:
    """Change shard `name` (its checksums computed again), then make its manifest entry and "crc32c" agree with it."""

    def mutate(directory: Path) -> None:
        shard = Shard.read(directory / name)
        change(shard)
        shard.write(directory / name)
        index = (directory / f"{name}.index").read_bytes()
        document = load_manifest(directory)
        entry(document, name).update(
            records=len(shard.offsets) - 1, data_size=len(shard.data), index_size=len(index),
            index_crc32c=crc32c(index), data_crc32c=crc32c(shard.data),
        )
        save_manifest(directory, document)

    return mutate


def rename_shard(old: str, new: str) -> Callable[[Path], None]:
    """Rename shard `old`'s files and its manifest entry to `new` ("crc32c" recomputed)."""

    def mutate(directory: Path) -> None:
        for suffix in (".data", ".index"):
            os.rename(directory / f"{old}{suffix}", directory / f"{new}{suffix}")
        edit_manifest(lambda document: entry(document, old).update(name=new))(directory)

    return mutate


def list_again_as(name: str, alias: str) -> Callable[[Path], None]:
    """List shard `name` a second time, at the end, under `alias` (no files are made for it)."""
    return edit_manifest(lambda document: document["shards"].append(dict(entry(document, name), name=alias)))


@dataclass(frozen=True)
class DatasetCase:
    rule: str
    what: str
    refused_at: str
    mutate: Callable[[Path], None]
    record: int | None = None
    base: Callable[[Path], None] = base_dataset  # writes the valid dataset that `mutate` changes


DATASET_CASES: dict[str, DatasetCase] = {
    "manifest-version-float": DatasetCase("§3.1", '"version" is 1.0, not the integer 1 ("crc32c" recomputed).', "open",
        edit_manifest(lambda document: document.update(version=1.0))),
    "manifest-version-true": DatasetCase("§3.1", '"version" is true.', "open", edit_manifest(lambda document: document.update(version=True))),
    "manifest-format-wrong": DatasetCase("§3.1", '"format" is "varstore-datasets".', "open",
        edit_manifest(lambda document: document.update(format="varstore-datasets"))),
    "manifest-unknown-member": DatasetCase("§3.1", 'The manifest has an unknown member "comment".', "open",
        edit_manifest(lambda document: document.update(comment="hello"))),
    "manifest-crc32c-float": DatasetCase("§3.1", '"crc32c" is written as a float (its correct value, then ".0").', "open",
        lambda directory: _crc32c_as_float(directory)),
    "manifest-crc32c-wrong": DatasetCase("§3.1", 'The "metadata" changed ("CC0" became "CC1") and "crc32c" did not.', "open",
        edit_manifest(lambda document: document["metadata"].update(licence="CC1"), fix_crc32c=False)),
    "manifest-duplicate-member": DatasetCase("§3.1", 'The manifest object has the member "format" twice.', "open",
        edit_manifest_text('{\n "codec"', '{\n "format": "varstore-dataset",\n "codec"')),
    "manifest-nan": DatasetCase("§3.1", "The manifest metadata holds NaN.", "open", edit_manifest_text('"CC0"', "NaN")),
    "manifest-codec-unknown-member": DatasetCase("§3.1", 'The "codec" object has an unknown member "level".', "open",
        edit_manifest(lambda document: document["codec"].update(level=1))),
    "manifest-codec-params-not-exact": DatasetCase("§3.1", 'The codec is {"name": "str", "params": {"dtype": "<u2", "shape": []}}.',
        "open", edit_manifest(lambda document: document["codec"]["params"].update(dtype="<u2", shape=[]))),
    "manifest-codec-dtype-big-endian": DatasetCase("§3.1", 'The manifest\'s codec parameters say dtype ">u2" (the shards '
        "say <u2): a value §2.1 refuses, in the manifest, so §3.1's.", "open",
        edit_manifest(lambda document: document["codec"]["params"].update(dtype=">u2")), base=base_u2_dataset),
    "manifest-codec-differs-from-shards": DatasetCase("§3.1", 'The manifest says codec "bytes"; the shards are str.', "open",
        edit_manifest(lambda document: document["codec"].update(name="bytes"))),
    "shard-name-dot-dot": DatasetCase("§3.1", 'A shard is named "..".', "open",
        edit_manifest(lambda document: entry(document, "b").update(name=".."))),
    "shard-name-with-slash": DatasetCase("§3.1", 'A shard is named "b/b".', "open",
        edit_manifest(lambda document: entry(document, "b").update(name="b/b"))),
    "shard-listed-twice": DatasetCase("§3.1", 'Shard "a" is listed twice.', "open",
        edit_manifest(lambda document: document["shards"].append(dict(entry(document, "a"))))),
    "shard-names-differ-only-in-case": DatasetCase("§3.1", 'Shard "a" is listed again, last, as "A" (no A.* files: on a '
        'case-insensitive filesystem "A" names a\'s files).', "open", list_again_as("a", "A")),
    "shard-name-temporary": DatasetCase("§3.1", 'Shard "b" and its files are named "b.varstore-tmp-1", a temporary name.',
        "open", rename_shard("b", "b.varstore-tmp-1")),
    "shard-entry-unknown-member": DatasetCase("§3.1", 'Shard "a"\'s object has an unknown member "note".', "open",
        edit_manifest(lambda document: entry(document, "a").update(note=""))),
    "manifest-symlink": DatasetCase("§3.1", "manifest.json is a symbolic link to a valid manifest beside it.", "open",
        symlink_to_moved(MANIFEST)),
    "shard-file-symlink": DatasetCase("§3.1", "c.index is a symbolic link to the real index beside it.", "open",
        symlink_to_moved("c.index")),
    "shard-file-missing": DatasetCase("§3.1", "c.data is missing.", "open", lambda directory: os.remove(directory / "c.data")),
    "shard-data-size-wrong": DatasetCase("§3.1", 'Shard "c"\'s "data_size" is one more than its file.', "open",
        edit_manifest(lambda document: entry(document, "c").update(data_size=entry(document, "c")["data_size"] + 1))),
    "shard-records-one-to-zero": DatasetCase("§3.1", 'Shard "a"\'s "records" is 0, its header says 1 ("crc32c" recomputed): '
        "a reader that skips 0-record shards would drop a record.", "open",
        edit_manifest(lambda document: entry(document, "a").update(records=0))),
    "empty-shard-index-crc32c-wrong": DatasetCase("§3.1", 'The 0-record shard "b"\'s "index_crc32c" has one bit flipped.', "open",
        edit_manifest(lambda document: entry(document, "b").update(index_crc32c=entry(document, "b")["index_crc32c"] ^ 1))),
    "shard-data-crc32c-wrong": DatasetCase("§3.1", 'Shard "c"\'s "data_crc32c" has one bit flipped.', "open",
        edit_manifest(lambda document: entry(document, "c").update(data_crc32c=entry(document, "c")["data_crc32c"] ^ 1))),
    "record-invalid-utf8": DatasetCase("§2", 'Shard "c"\'s record (global record 1) is the bytes ff fe; every checksum and the '
        "manifest entry agree with them.", "read", rewrite_shard("c", lambda shard: shard.set_records([b"\xff\xfe"])), record=1),
    "shard-codec-params-differ": DatasetCase("§3.1", 'Shard "a"\'s metadata says dtype "<i2", the manifest "<u2" (its entry '
        "follows the shard): its header agrees at open; a reader must refuse before reading from it.", "read",
        rewrite_shard("a", lambda shard: setattr(shard, "metadata", b'{"codec":{"dtype":"<i2","shape":[]},"user":{}}')),
        record=0, base=base_u2_dataset),
    "empty-shard-codec-params-differ": DatasetCase("§3.1", 'The 0-record shard "b"\'s metadata says shape [1], the manifest '
        '[] (its entry follows the shard): nothing is ever read from it, so it is checked whole at open.', "open",
        rewrite_shard("b", lambda shard: setattr(shard, "metadata", b'{"codec":{"dtype":"<u2","shape":[1]},"user":{}}')),
        base=base_u2_dataset),
    "empty-shard-codec-params-lack-shape": DatasetCase("§2", 'The 0-record shard "b"\'s metadata codec parameters lack "shape" '
        "(its entry follows the shard): a shard's own rule, checked at open for a shard of no records.", "open",
        rewrite_shard("b", lambda shard: setattr(shard, "metadata", b'{"codec":{"dtype":"<u2"},"user":{}}')),
        base=base_u2_dataset),
    "manifest-minus-zero-checksummed-as-float": DatasetCase("§3.1", 'The manifest metadata holds -0, and "crc32c" is '
        "that of the canonical JSON with the float -0.0 in its place (-0 is the integer 0).", "open",
        lambda directory: _minus_zero_checksummed_as_float(directory)),
}


def _minus_zero_checksummed_as_float(directory: Path) -> None:
    edit_manifest(lambda document: document["metadata"].update(zero=-0.0))(directory)
    edit_manifest_text('"zero": -0.0', '"zero": -0')(directory)


def _crc32c_as_float(directory: Path) -> None:
    crc = load_manifest(directory)["crc32c"]
    edit_manifest_text(f'"crc32c": {crc},', f'"crc32c": {crc}.0,')(directory)


# -- writing it all ----------------------------------------------------------------------------


def case_description(kind: str, case: Case | DatasetCase) -> dict[str, Any]:
    description = {"kind": kind, "rule": case.rule, "what": case.what, "refused_at": case.refused_at}
    if case.record is not None:
        description["record"] = case.record
    return description


def write_description(path: Path, description: dict[str, Any]) -> None:
    path.write_text(json.dumps(description, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")


def write_shard_case(directory: Path, case: Case) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        made = case.make(Path(scratch))
        index, data = made.pack() if isinstance(made, Shard) else made
    (directory / "shard.index").write_bytes(index)
    if data is not None:
        (directory / "shard.data").write_bytes(data)


def write_dataset_case(directory: Path, case: DatasetCase) -> None:
    case.base(directory)
    case.mutate(directory)


def main() -> None:
    for path in sorted(DATASETS.glob("*.json")):
        description = json.loads(path.read_text(encoding="utf-8"))
        replace_directory(DATASETS / path.stem, lambda directory: write_dataset(directory, description))
        print(f"dataset {path.stem}: {len(description['shards'])} shards")
    if DAMAGED.exists():
        shutil.rmtree(DAMAGED)
    DAMAGED.mkdir()
    for kind, cases, write in (("shard", SHARD_CASES, write_shard_case), ("dataset", DATASET_CASES, write_dataset_case)):
        for name, case in cases.items():
            (DAMAGED / name).mkdir()
            write(DAMAGED / name, case)
            write_description(DAMAGED / f"{name}.json", case_description(kind, case))
    print(f"damaged: {len(SHARD_CASES)} shard cases, {len(DATASET_CASES)} dataset cases")


if __name__ == "__main__":
    main()

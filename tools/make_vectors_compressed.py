"""Write the compressed vectors and damaged cases of spec/vectors/compressed/ (§1.6, and §1.7's blocks):
``python tools/make_vectors_compressed.py``.

zstd's output depends on the library version, so unlike the 1.1 vectors these shards are not reproduced byte for
byte by tests: they are written once, committed, and read back by both readers. Each description ``NAME.json``
holds the records (in §6.1's notation) from a fixed generator below; the tests check that the spec-only reader
and varstore read each shard back to it. A damaged case is a good shard taken apart and put together again with
one rule of §1.6 (or §1.7) broken and every checksum it does not target computed again. A block vector's description
also holds ``"blocks"``, the records' counts per block.
"""

from __future__ import annotations

import bisect
import json
import shutil
import struct
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import zstandard

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import varstore
from varstore.format.checksum import crc32c
from varstore.format.compression import NAMES
from varstore.format.notation import to_json

COMPRESSED = ROOT / "spec" / "vectors" / "compressed"
DAMAGED = COMPRESSED / "damaged"
_HEADER = struct.Struct("<8sHHBBHQQQIII8sI")
_FIELDS = ("magic", "major_version", "minor_version", "codec", "compression", "flags", "record_count", "data_size",
           "metadata_size", "data_crc32c", "data_edge_crc32c", "body_crc32c", "dictionary_fields", "header_crc32c")


def _prose(count: int, words: int) -> list[str]:
    """Deterministic text records: sentences over a small vocabulary, so they compress as text does."""
    vocabulary = ["the", "of", "a", "shard", "record", "frame", "reader", "writer", "dictionary", "index", "offset", "checksum", "data", "file", "zstd"]
    generator = np.random.default_rng(24)
    return [" ".join(vocabulary[k] for k in generator.integers(0, len(vocabulary), words + index % 7)) for index in range(count)]


def _records(name: str) -> tuple[str, dict[str, Any], list[Any], str]:
    """(codec, codec options, records, compression) of each good vector."""
    if name == "zstd-bytes-empty-records":
        return "bytes", {}, [b"", b"x", b"", bytes(range(256)) * 4, b""], "zstd"
    if name == "zstd-str-documents":
        return "str", {}, _prose(8, 200), "zstd"
    if name == "zstd-dict-msgpack-rows":
        return "msgpack", {}, [{"id": index, "text": text} for index, text in enumerate(_prose(200, 12))], "zstd-dict"
    if name == "zstd-dict-ndarray-tokens":
        generator = np.random.default_rng(7)
        return "ndarray", {"dtype": "<u2"}, [generator.integers(0, 50, 30 + index % 11).astype("<u2") for index in range(400)], "zstd-dict"
    if name == "zstd-blocks-bytes-empty-records":
        # blocks: 5 records (3 empty), a record over the 8 KiB target alone, 3 empty records alone, another alone, 2
        large, larger = bytes(range(256)) * 80, bytes(range(255, -1, -1)) * 67
        return "bytes", {}, [b"", b"x", b"", bytes(range(256)) * 4, b"", large, b"", b"", b"", larger, b"small", b""], "zstd-blocks"
    if name == "zstd-blocks-msgpack-rows":
        return "msgpack", {}, [{"id": index, "text": text, "even": index % 2 == 0} for index, text in enumerate(_prose(1500, 12))], "zstd-blocks"
    if name == "zstd-dict-blocks-str-lines":
        return "str", {}, [f"line {index}: {text}" for index, text in enumerate(_prose(800, 10))], "zstd-dict-blocks"
    raise KeyError(name)


GOOD = ("zstd-bytes-empty-records", "zstd-str-documents", "zstd-dict-msgpack-rows", "zstd-dict-ndarray-tokens")
BLOCKS = ("zstd-blocks-bytes-empty-records", "zstd-blocks-msgpack-rows", "zstd-dict-blocks-str-lines")
SMALL_WINDOW = "zstd-record-larger-than-window"


def write_good(prefix: Path, name: str) -> list[Any]:
    codec, options, records, compression = _records(name)
    with varstore.Writer(prefix, codec, compression=compression, overwrite=True, **options) as writer:
        writer.extend(records)
    return records


@dataclass
class Parts:
    """A compressed shard taken apart (§1.6); `pack` puts it together with every derived field computed anew,
    except the header fields named in `keep`."""

    header: dict[str, Any]
    metadata: bytes
    dictionary: bytes
    frames: list[bytes]
    sizes: list[int]
    keep: dict[str, Any]

    @classmethod
    def read(cls, prefix: Path) -> Parts:
        index, data = Path(f"{prefix}.index").read_bytes(), Path(f"{prefix}.data").read_bytes()
        header = dict(zip(_FIELDS, _HEADER.unpack_from(index)))
        size, _ = struct.unpack("<II", header["dictionary_fields"])
        count = header["record_count"]
        dictionary_start = (64 + header["metadata_size"] + 7) // 8 * 8
        offsets_start = (dictionary_start + size + 7) // 8 * 8
        offsets = struct.unpack_from(f"<{count + 1}Q", index, offsets_start)
        sizes_start = offsets_start + 8 * (count + 1) + (4 * count if header["flags"] & 1 else 0)
        sizes = list(struct.unpack_from(f"<{count}I", index, sizes_start))
        frames = [data[start:end] for start, end in zip(offsets, offsets[1:])]
        return cls(header, index[64 : 64 + header["metadata_size"]], index[dictionary_start : dictionary_start + size], frames, sizes, {})

    def pack(self) -> tuple[bytes, bytes]:
        data = b"".join(self.frames)
        offsets = [0]
        for frame in self.frames:
            offsets.append(offsets[-1] + len(frame))
        body = self.metadata + bytes(-(64 + len(self.metadata)) % 8) + self.dictionary + bytes(-len(self.dictionary) % 8)
        body += struct.pack(f"<{len(offsets)}Q", *offsets)
        if self.header["flags"] & 1:
            body += struct.pack(f"<{len(self.frames)}I", *(crc32c(frame) for frame in self.frames))
        body += struct.pack(f"<{len(self.sizes)}I", *self.sizes)
        edge = min(4096, len(data))
        header = {**self.header, "record_count": len(self.frames), "data_size": len(data), "metadata_size": len(self.metadata),
                  "data_crc32c": crc32c(data), "data_edge_crc32c": crc32c(data[len(data) - edge :], crc32c(data[:edge])),
                  "body_crc32c": crc32c(body),
                  "dictionary_fields": struct.pack("<II", len(self.dictionary), crc32c(self.dictionary) if self.dictionary else 0)}
        header.update(self.keep)
        raw = _HEADER.pack(*(header[name] for name in _FIELDS))
        return raw[:60] + struct.pack("<I", crc32c(raw[:60])) + body, data


@dataclass
class BlockParts:
    """A 3.x shard taken apart (§1.7); `pack` puts it together with every derived field computed anew, except the
    header fields named in `keep` and the block table entries named in `table` ("count": the stored B,
    "offsets" and "checksums": lists in place of those computed from the frames)."""

    header: dict[str, Any]
    metadata: bytes
    dictionary: bytes
    offsets: list[int]  # of the records, in decoded space
    records: list[int]  # block_records
    frames: list[bytes]
    keep: dict[str, Any]
    table: dict[str, Any]

    @classmethod
    def read(cls, prefix: Path) -> BlockParts:
        index, data = Path(f"{prefix}.index").read_bytes(), Path(f"{prefix}.data").read_bytes()
        header = dict(zip(_FIELDS, _HEADER.unpack_from(index)))
        size, _ = struct.unpack("<II", header["dictionary_fields"])
        count = header["record_count"]
        dictionary_start = (64 + header["metadata_size"] + 7) // 8 * 8
        offsets_start = (dictionary_start + size + 7) // 8 * 8
        offsets = list(struct.unpack_from(f"<{count + 1}Q", index, offsets_start))
        blocks_start = offsets_start + 8 * (count + 1)
        (block_count,) = struct.unpack_from("<Q", index, blocks_start)
        block_offsets = struct.unpack_from(f"<{block_count + 1}Q", index, blocks_start + 8)
        records = list(struct.unpack_from(f"<{block_count + 1}Q", index, blocks_start + 8 + 8 * (block_count + 1)))
        frames = [data[start:end] for start, end in zip(block_offsets, block_offsets[1:])]
        return cls(header, index[64 : 64 + header["metadata_size"]], index[dictionary_start : dictionary_start + size],
                   offsets, records, frames, {}, {})

    def decoded(self, block: int) -> bytes:
        """Block `block`'s decoded bytes."""
        dictionary = zstandard.ZstdCompressionDict(self.dictionary) if self.dictionary else None
        return zstandard.ZstdDecompressor(dict_data=dictionary).decompress(self.frames[block])

    def compress(self, content: bytes) -> bytes:
        """`content` as one frame of this shard (with its dictionary, if it has one)."""
        dictionary = zstandard.ZstdCompressionDict(self.dictionary) if self.dictionary else None
        return zstandard.ZstdCompressor(level=3, dict_data=dictionary, write_content_size=True).compress(content)

    def pack(self) -> tuple[bytes, bytes]:
        data = b"".join(self.frames)
        block_offsets = self.table.get("offsets") or [0, *np.cumsum([len(frame) for frame in self.frames]).tolist()]
        checksums = self.table.get("checksums") or [crc32c(frame) for frame in self.frames]
        body = self.metadata + bytes(-(64 + len(self.metadata)) % 8) + self.dictionary + bytes(-len(self.dictionary) % 8)
        body += struct.pack(f"<{len(self.offsets)}Q", *self.offsets)
        body += struct.pack("<Q", self.table.get("count", len(self.frames)))
        body += struct.pack(f"<{len(block_offsets)}Q", *block_offsets) + struct.pack(f"<{len(self.records)}Q", *self.records)
        body += struct.pack(f"<{len(checksums)}I", *checksums)
        edge = min(4096, len(data))
        header = {**self.header, "record_count": len(self.offsets) - 1, "data_size": len(data), "metadata_size": len(self.metadata),
                  "data_crc32c": crc32c(data), "data_edge_crc32c": crc32c(data[len(data) - edge :], crc32c(data[:edge])),
                  "body_crc32c": crc32c(body),
                  "dictionary_fields": struct.pack("<II", len(self.dictionary), crc32c(self.dictionary) if self.dictionary else 0)}
        header.update(self.keep)
        raw = _HEADER.pack(*(header[name] for name in _FIELDS))
        return raw[:60] + struct.pack("<I", crc32c(raw[:60])) + body, data


def write_small_window(prefix: Path) -> list[Any]:
    """A record of 300 KB in frames whose window is 128 KiB (window_log 17): several blocks, a window smaller than the
    record; varstore's writer, which lets zstd size the window to the record, never writes one."""
    records = ["".join(_prose(1200, 30))[:300_000], "short"]
    with varstore.Writer(prefix, "str", compression="zstd", overwrite=True) as writer:
        writer.extend(records)
    parts = Parts.read(prefix)
    parameters = zstandard.ZstdCompressionParameters.from_level(3, window_log=17, write_content_size=True, write_checksum=True)
    parts.frames = [zstandard.ZstdCompressor(compression_params=parameters).compress(record.encode()) for record in records]
    _write(prefix, parts.pack())
    return records


def _write(prefix: Path, files: tuple[bytes, bytes]) -> None:
    Path(f"{prefix}.index").write_bytes(files[0])
    Path(f"{prefix}.data").write_bytes(files[1])


# -- damaged cases ---------------------------------------------------------------------------------------------


@dataclass
class Case:
    base: str  # the good vector it starts from
    change: Callable[[Parts], None]
    rule: str
    what: str
    refused_at: str
    record: int | None = None


def _other_dictionary_frame(parts: Parts) -> None:
    samples = [f"another corpus entirely, line {index} of {index * 7}".encode() for index in range(400)]
    other = zstandard.train_dictionary(4096, samples, k=200, d=8, steps=0)
    payload = zstandard.ZstdDecompressor(dict_data=zstandard.ZstdCompressionDict(parts.dictionary)).decompress(parts.frames[1])
    parts.frames[1] = zstandard.ZstdCompressor(level=3, dict_data=other).compress(payload)


def _declares_less(parts: Parts) -> None:
    payload = zstandard.ZstdDecompressor().decompress(parts.frames[1])[:100]
    frame = bytearray(zstandard.ZstdCompressor(level=3).compress(payload + b"!" * 40))
    assert frame[4] & 0xE0 == 0x20 and frame[5] == 140  # single segment, a 1-byte content size at byte 5
    frame[5] = len(payload)
    parts.frames[1], parts.sizes[1] = bytes(frame), len(payload)


def _bomb(parts: Parts) -> None:
    parts.frames[1] = zstandard.ZstdCompressor(level=19).compress(bytes(64 << 20))


def _without_content_size(parts: Parts) -> None:
    payload = zstandard.ZstdDecompressor().decompress(parts.frames[1])
    parts.frames[1] = zstandard.ZstdCompressor(level=3, write_content_size=False).compress(payload)


CASES = {
    "dictionary-crc32c-wrong": Case("zstd-dict-msgpack-rows", lambda parts: parts.keep.update(
        dictionary_fields=struct.pack("<II", len(parts.dictionary), crc32c(parts.dictionary) ^ 1)),
        "§1.6", "dictionary_crc32c is flipped in one bit (the header's own CRC computed again).", "open"),
    "dictionary-id-zero": Case("zstd-dict-msgpack-rows", lambda parts: setattr(parts, "dictionary", parts.dictionary[:4] + bytes(4) + parts.dictionary[8:]),
        "§1.6", "the dictionary's Dictionary_ID is 0 (its CRC32C computed again).", "open"),
    "compression-3": Case("zstd-str-documents", lambda parts: parts.keep.update(compression=3),
        "§1.3 step 4", "the header's compression is 3 (zstd-blocks, a 3.x compression) in a 2.x header.", "open"),
    "compression-member-names-other": Case("zstd-str-documents", lambda parts: setattr(parts, "metadata", parts.metadata.replace(b'"name":"zstd"', b'"name":"zstd-dict"')),
        "§1.6", 'the metadata\'s "compression" names zstd-dict; the header says zstd.', "open"),
    "frame-decodes-to-more-than-declared": Case("zstd-str-documents", _declares_less,
        "§1.6", "record 1's frame declares (and sizes[1] says) fewer bytes than its blocks decode to.", "read", 1),
    "frame-zstd-bomb": Case("zstd-str-documents", _bomb,
        "§1.6", "record 1 is a 2 KB frame of 64 MiB of zeros; sizes[1] still says the record's own size.", "read", 1),
    "frame-of-another-dictionary": Case("zstd-dict-msgpack-rows", _other_dictionary_frame,
        "§1.6", "record 1 is a valid zstd frame of its payload made with another dictionary.", "read", 1),
    "frame-without-content-size": Case("zstd-str-documents", _without_content_size,
        "§1.6", "record 1's frame does not declare Frame_Content_Size.", "read", 1),
    "frame-followed-by-a-byte": Case("zstd-str-documents", lambda parts: parts.frames.__setitem__(1, parts.frames[1] + b"\0"),
        "§1.6", "record 1 is its frame and one more byte.", "read", 1),
    "size-disagrees-with-frame": Case("zstd-str-documents", lambda parts: parts.sizes.__setitem__(1, parts.sizes[1] + 1),
        "§1.6", "sizes[1] is one more than record 1's Frame_Content_Size.", "read", 1),
}


def _first_hidden_record(parts: BlockParts) -> int:
    """The first record whose read is refused after `parts.records` was damaged: the spec's bisect finds a block
    that does not bracket it, or one whose block_size, computed from the damaged table, is not its frame's size."""
    table, count = parts.records, len(parts.offsets) - 1
    for record in range(count):
        block = bisect.bisect_right(table, record) - 1
        if not (0 <= block < len(parts.frames) and table[block] <= record < table[block + 1] <= count):
            return record
        if parts.offsets[table[block + 1]] - parts.offsets[table[block]] != len(parts.decoded(block)):
            return record
    raise AssertionError("the damaged table hides no record")


def _records_out_of_order(parts: BlockParts) -> None:
    parts.records[3] = parts.records[5]  # block_records[3] > block_records[4]: the table is no longer sorted
    _OUT_OF_ORDER_RECORD.append(_first_hidden_record(parts))


def _content_size_differs(parts: BlockParts) -> None:
    parts.frames[1] = parts.compress(parts.decoded(1) + b"!")


_OUT_OF_ORDER_RECORD: list[int] = []  # the record `_records_out_of_order` hides, found as the vector is made
_MSGPACK_BLOCKS = "zstd-blocks-msgpack-rows"

BLOCK_CASES = {
    "block-checksum-wrong": Case(_MSGPACK_BLOCKS, lambda parts: parts.table.update(
        checksums=[crc32c(frame) ^ (block == 2) for block, frame in enumerate(parts.frames)]),
        "§1.7", "block 2's checksum is flipped in one bit; its frame is sound. A read of any record of block 2 is "
        "refused (the first is named).", "read"),
    "block-count-greater-than-records": Case(_MSGPACK_BLOCKS, lambda parts: parts.table.update(count=len(parts.offsets)),
        "§1.3 step 6", "B is N + 1 (the table itself, and the index size, are for the real B).", "open"),
    "block-records-not-ending-at-n": Case(_MSGPACK_BLOCKS, lambda parts: parts.records.__setitem__(-1, parts.records[-1] - 1),
        "§1.7", "block_records[B] is N - 1.", "open"),
    "block-offsets-not-ending-at-data-size": Case(_MSGPACK_BLOCKS, lambda parts: parts.table.update(
        offsets=[0, *np.cumsum([len(frame) for frame in parts.frames[:-1]]).tolist(), sum(map(len, parts.frames)) - 1]),
        "§1.7", "block_offsets[B] is data_size - 1.", "open"),
    "blocks-flag-bit-0-set": Case(_MSGPACK_BLOCKS, lambda parts: parts.keep.update(flags=1),
        "§1.3 step 4", "flag bit 0 (record checksums) is set in a 3.x header, which has none.", "open"),
    "block-records-out-of-order": Case(_MSGPACK_BLOCKS, _records_out_of_order,
        "§1.7", "block_records[3] is block_records[5], so the table is not sorted: block 2 then claims the records of "
        "blocks 2-4, and its frame declares fewer bytes than that block_size.", "read"),
    "block-frame-content-size-differs": Case(_MSGPACK_BLOCKS, _content_size_differs,
        "§1.7", "block 1 is a valid frame of its decoded bytes and one more byte (its checksum computed again): its "
        "Frame_Content_Size is block_size(1) + 1.", "read"),
    "blocks-compression-1": Case(_MSGPACK_BLOCKS, lambda parts: parts.keep.update(compression=1),
        "§1.3 step 4", "the header's compression is 1 (zstd, a 2.x compression) in a 3.x header.", "open"),
}


def _block_case_record(name: str, parts: BlockParts) -> int | None:
    """The record a read of the block case `name` is refused at: the first of its damaged block, or the hidden one."""
    if name == "block-checksum-wrong":
        return parts.records[2]
    if name == "block-frame-content-size-differs":
        return parts.records[1]
    if name == "block-records-out-of-order":
        return _OUT_OF_ORDER_RECORD[-1]
    return None


def _describe_vector(prefix: Path, records: list[Any]) -> dict[str, Any]:
    """A good vector's description: its codec, compression and records, and for blocks the records per block."""
    with varstore.open(prefix) as reader:
        codec, params = reader.codec, {"dtype": reader.dtype.str, "shape": list(reader.shape)} if reader.dtype else {}
        description: dict[str, Any] = {"codec": codec, "codec_params": params, "compression": NAMES[reader.header.compression]}
    if description["compression"].endswith("-blocks"):
        description["blocks"] = np.diff(BlockParts.read(prefix).records).tolist()
    description["records"] = [to_json(record) for record in records]
    return description


def _write_case(name: str, case: Case, parts: Any) -> None:
    case.change(parts)
    (DAMAGED / name).mkdir()
    _write(DAMAGED / name / "shard", parts.pack())
    description = {"kind": "shard", "rule": case.rule, "what": case.what, "refused_at": case.refused_at}
    record = case.record if isinstance(parts, Parts) else _block_case_record(name, parts)
    if record is not None:
        description["record"] = record
    (DAMAGED / f"{name}.json").write_text(json.dumps(description, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")


def main() -> None:
    if COMPRESSED.exists():
        shutil.rmtree(COMPRESSED)
    DAMAGED.mkdir(parents=True)
    for name in (*GOOD, SMALL_WINDOW, *BLOCKS):
        prefix = COMPRESSED / name
        records = write_small_window(prefix) if name == SMALL_WINDOW else write_good(prefix, name)
        description = _describe_vector(prefix, records)
        Path(f"{prefix}.json").write_text(json.dumps(description, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
        print(f"{name}: {len(records)} records" + (f" in {len(description['blocks'])} blocks" if "blocks" in description else ""))
    with tempfile.TemporaryDirectory() as scratch:
        for name, case in {**CASES, **BLOCK_CASES}.items():
            base = Path(scratch) / case.base
            write_good(base, case.base)
            _write_case(name, case, BlockParts.read(base) if name in BLOCK_CASES else Parts.read(base))
    print(f"damaged: {len(CASES) + len(BLOCK_CASES)} cases")


if __name__ == "__main__":
    main()

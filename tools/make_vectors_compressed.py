"""Write the compressed vectors and damaged cases of spec/vectors/compressed/ (§1.6): ``python tools/make_vectors_compressed.py``.

zstd's output depends on the library version, so unlike the 1.1 vectors these shards are not reproduced byte for
byte by tests: they are written once, committed, and read back by both readers. Each description ``NAME.json``
holds the records (in §6.1's notation) from a fixed generator below; the tests check that the spec-only reader
and varstore read each shard back to it. A damaged case is a good shard taken apart and put together again with
one rule of §1.6 broken and every checksum it does not target computed again.
"""

from __future__ import annotations

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
    raise KeyError(name)


GOOD = ("zstd-bytes-empty-records", "zstd-str-documents", "zstd-dict-msgpack-rows", "zstd-dict-ndarray-tokens")
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
        "§1.3 step 4", "the header's compression is 3, which no version defines.", "open"),
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


def main() -> None:
    if COMPRESSED.exists():
        shutil.rmtree(COMPRESSED)
    DAMAGED.mkdir(parents=True)
    for name in (*GOOD, SMALL_WINDOW):
        prefix = COMPRESSED / name
        records = write_small_window(prefix) if name == SMALL_WINDOW else write_good(prefix, name)
        with varstore.open(prefix) as reader:
            codec, params = reader.codec, {"dtype": reader.dtype.str, "shape": list(reader.shape)} if reader.dtype else {}
            compression = ("none", "zstd", "zstd-dict")[reader.header.compression]
        description = {"codec": codec, "codec_params": params, "compression": compression,
                       "records": [to_json(record) for record in records]}
        Path(f"{prefix}.json").write_text(json.dumps(description, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
        print(f"{name}: {len(records)} records")
    with tempfile.TemporaryDirectory() as scratch:
        for name, case in CASES.items():
            base = Path(scratch) / case.base
            write_good(base, case.base)
            parts = Parts.read(base)
            case.change(parts)
            (DAMAGED / name).mkdir()
            _write(DAMAGED / name / "shard", parts.pack())
            description = {"kind": "shard", "rule": case.rule, "what": case.what, "refused_at": case.refused_at}
            if case.record is not None:
                description["record"] = case.record
            (DAMAGED / f"{name}.json").write_text(json.dumps(description, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"damaged: {len(CASES)} cases")


if __name__ == "__main__":
    main()

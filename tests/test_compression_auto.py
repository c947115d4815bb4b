"""How a writer sizes a shard's dictionary and what ``"auto"`` records (issue 24 step D): the dictionary is a
fiftieth of the sample, from 1 KiB to 110 KiB, so that it earns its size back on the shard's own records; the
sample ratios ``"auto"`` records count the dictionary it stores. Sizes are read from the files, not the writer."""

from __future__ import annotations

import json
import os
import random
import struct
from pathlib import Path

import pytest

pytest.importorskip("zstandard", reason="compressed shards need the zstd extra: pip install -e '.[zstd]'")

import varstore

METADATA_SIZE_AT, COMPRESSION_AT, DICTIONARY_SIZE_AT = 32, 13, 52
HEADER_SIZE = 64
EVENTS = ["opened", "clicked", "scrolled", "closed", "shared", "saved", "searched"]
WORDS = ["shard", "record", "frame", "reader", "writer", "index", "offset", "level", "sample", "window", "token"]


def json_rows(count: int, seed: int = 24) -> list[str]:
    """Rows like an event log's: a few repeated keys and values, a varying id and a few words."""
    generator = random.Random(seed)
    return [json.dumps({"id": k, "user": f"user-{generator.randrange(500)}", "event": generator.choice(EVENTS),
                        "text": " ".join(generator.choice(WORDS) for _ in range(generator.randrange(3, 12)))})
            for k in range(count)]


def write(path: Path, records: list[str], compression: str) -> Path:
    with varstore.Writer(path, "str", compression=compression) as writer:
        writer.extend(records)
    return path


def header_field(path: Path, offset: int, form: str) -> int:
    with open(f"{path}.index", "rb") as stream:
        return struct.unpack_from(form, stream.read(HEADER_SIZE), offset)[0]


def stored_metadata(path: Path) -> dict:
    index = Path(f"{path}.index").read_bytes()
    size = struct.unpack_from("<Q", index, METADATA_SIZE_AT)[0]
    return json.loads(index[HEADER_SIZE : HEADER_SIZE + size])


def raw_bytes(records: list[str]) -> int:
    return sum(len(record.encode()) for record in records)


def test_the_dictionary_of_a_large_sample_is_at_most_a_fiftieth_of_it(tmp_path):
    records = json_rows(3000)
    raw = raw_bytes(records)
    assert 200_000 < raw < 4 << 20  # the whole shard is the sample
    shard = write(tmp_path / "rows", records, "zstd-dict")
    assert header_field(shard, COMPRESSION_AT, "<B") == 2
    assert 1024 <= header_field(shard, DICTIONARY_SIZE_AT, "<I") <= raw // 50


def test_a_sample_of_10_to_50_kib_trains_a_dictionary_of_1_kib(tmp_path):
    records = json_rows(200)
    raw = raw_bytes(records)
    assert 10 << 10 <= raw < 50 << 10
    shard = write(tmp_path / "rows", records, "zstd-dict")
    assert header_field(shard, COMPRESSION_AT, "<B") == 2
    assert raw // 50 < header_field(shard, DICTIONARY_SIZE_AT, "<I") <= 1024  # 1 KiB, more than a fiftieth


def test_tiny_records_with_their_dictionary_take_fewer_bytes_than_raw(tmp_path):
    """5,000 records of ~30 bytes: a 110 KiB dictionary alone would be two thirds of their raw size."""
    records = [f"user-{k % 97} clicked item {k * 7919 % 10007}" for k in range(5000)]
    shard = write(tmp_path / "tiny", records, "zstd-dict")
    dictionary = header_field(shard, DICTIONARY_SIZE_AT, "<I")
    assert os.path.getsize(f"{shard}.data") + dictionary < raw_bytes(records)
    with varstore.open(shard) as reader:
        assert reader.get_batch([0, 4999]) == [records[0], records[4999]]


def test_auto_records_the_ratio_of_what_it_stores(tmp_path):
    records = json_rows(3000, seed=7)
    shard = write(tmp_path / "rows", records, "auto")
    member = stored_metadata(shard)["compression"]
    # small JSON rows: blocks win (§1.7), and the sample is the whole shard, grouped as the writer groups it
    assert (header_field(shard, COMPRESSION_AT, "<B"), member["name"]) in ((3, "zstd-blocks"), (4, "zstd-dict-blocks"))
    measured = member["auto"]
    assert measured["sample_records"] == len(records) and measured["sample_bytes"] == raw_bytes(records)
    stored = os.path.getsize(f"{shard}.data") + header_field(shard, DICTIONARY_SIZE_AT, "<I")
    assert measured["sample_ratios"][member["name"]] == pytest.approx(stored / raw_bytes(records), abs=1e-4)
    with varstore.open(shard) as reader:
        assert list(reader) == records


def test_auto_keeps_records_raw_when_blocks_save_only_what_shared_headers_give(tmp_path):
    """Records each incompressible but sharing a header (as PNG icons share their chunk headers): blocks save about
    a sixth, which a block read's decoding does not repay over a raw slice; auto stores them raw."""
    generator = random.Random(9)
    header = bytes(generator.randrange(256) for _ in range(200))
    records = [header + generator.randbytes(800) for _ in range(2000)]
    with varstore.Writer(tmp_path / "s", "bytes", compression="auto") as writer:
        writer.extend(records)
    member = stored_metadata(tmp_path / "s")["compression"]
    ratios = member["auto"]["sample_ratios"]
    assert 0.75 < ratios["zstd-blocks"] <= 0.9 and ratios["zstd"] > 0.9  # what a tenth's rule alone would store in blocks
    assert member["name"] == "none"
    with varstore.open(tmp_path / "s") as reader:
        assert reader.header.compression == 0 and reader[1999] == records[1999]

"""The CLI on shards of compressed blocks (spec/FORMAT.md §1.7): `info` says the compression, the block count and
size and that the checksums are per block; `stats` gives stored and raw bytes; `dump` decodes; `verify` names the
records of a damaged block; `convert --compression` takes the block modes."""

from __future__ import annotations

import json
import struct

from varstore.format.checksum import crc32c

from .helpers_cli import run, run_json, write_dataset

ROWS = [f"row {i}: " + "word " * (i % 30) for i in range(4000)]


def test_info_says_blocks_their_count_and_average_size_and_per_block_checksums(tmp_path, capsys):
    dataset = write_dataset(tmp_path / "d", ROWS, codec="str", max_shard_records=1500, compression="zstd-blocks")
    facts = run_json(capsys, "info", dataset)
    raw = sum(len(row.encode()) for row in ROWS)
    assert facts["format_version"] == [3, 0] and facts["compression"] == "zstd-blocks" and facts["raw_size"] == raw
    assert facts["block_count"] == sum(shard["block_count"] for shard in facts["shards"]) > 3
    code, out, _ = run(capsys, "info", dataset)
    assert code == 0
    assert f"in {facts['block_count']} blocks of " in out and "CRC32C per block" in out


def test_stats_dump_and_verify_read_a_block_shard(tmp_path, capsys):
    dataset = write_dataset(tmp_path / "d", ROWS, codec="str", max_shard_records=1500, compression="zstd-dict-blocks")
    stats = run_json(capsys, "stats", dataset)
    assert [shard["compression"] for shard in stats["shards"]] == ["zstd-dict-blocks"] * 3
    assert sum(shard["raw_bytes"] for shard in stats["shards"]) == sum(len(row.encode()) for row in ROWS)
    code, out, _ = run(capsys, "dump", dataset, "-i", 3999, "--raw")
    assert code == 0 and out.rstrip("\n") == ROWS[3999]
    assert run(capsys, "verify", dataset)[0] == 0


def test_verify_names_every_record_of_a_damaged_block(tmp_path, capsys):
    dataset = write_dataset(tmp_path / "d", ROWS, codec="str", max_shard_records=4000, compression="zstd-blocks")
    data = tmp_path / "d" / "shard-000000.data"
    damaged = bytearray(data.read_bytes())
    damaged[40] ^= 0xFF  # inside block 0's frame
    data.write_bytes(bytes(damaged))
    index_path = tmp_path / "d" / "shard-000000.index"
    index = bytearray(index_path.read_bytes())  # its edges' CRC32C made right again: the open's check passes
    edge = min(4096, len(damaged))
    struct.pack_into("<I", index, 44, crc32c(bytes(damaged[len(damaged) - edge :]), crc32c(bytes(damaged[:edge]))))
    struct.pack_into("<I", index, 60, crc32c(bytes(index[:60])))
    index_path.write_bytes(bytes(index))
    manifest = json.loads((tmp_path / "d" / "manifest.json").read_text())
    manifest.pop("crc32c", None)
    manifest["shards"][0]["index_crc32c"] = crc32c(bytes(index))
    (tmp_path / "d" / "manifest.json").write_text(json.dumps(manifest))
    code, out, err = run(capsys, "verify", dataset, "--json")
    assert code != 0
    report = json.loads(out)
    (shard,) = report["shards"]
    assert shard["bad_records"] and shard["bad_records"] == list(range(len(shard["bad_records"])))


def test_convert_writes_the_block_modes(tmp_path, capsys):
    source = tmp_path / "rows.jsonl"
    source.write_text("".join(json.dumps({"i": i, "text": row}) + "\n" for i, row in enumerate(ROWS[:500])), encoding="utf-8")
    for mode in ("zstd-blocks", "zstd-dict-blocks"):
        code, _, err = run(capsys, "convert", source, tmp_path / mode, "--compression", mode, "--quiet")
        assert code == 0, err
        facts = run_json(capsys, "info", tmp_path / mode)
        assert (facts["compression"], facts["format_version"]) == (mode, [3, 0])

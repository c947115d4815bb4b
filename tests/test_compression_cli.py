"""Compression where a user meets it (issue 24 step C): ``convert --compression`` and `conversion.convert`, and what
``info``, ``stats``, ``dump`` and ``verify`` say of compressed shards; a compressed shard read without the zstd extra.

Expected figures come from the files themselves (header bytes 13 and 52-55, file sizes, the records written), not
from varstore's own description of them."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("zstandard", reason="compressed shards need the zstd extra: pip install -e '.[zstd]'")

import varstore
from varstore.conversion import convert
from varstore.errors import VarstoreError

from . import spec_reader
from .helpers_cli import run, run_json

ROOT = Path(__file__).resolve().parent.parent
COMPRESSED = ROOT / "spec" / "vectors" / "compressed"
COMPRESSION_BYTE = 13  # the header's compression: 0 none, 1 zstd, 2 zstd with a dictionary (spec §1.2, §1.6)
DICTIONARY_SIZE_AT = 52

# Sentences of a small vocabulary, like a text corpus's lines: they compress, and a dictionary helps them.
WORDS = ["the", "a", "shard", "record", "frame", "reader", "writer", "index", "offset", "dictionary", "level", "sample",
         "compress", "decode"]
TEXTS = [" ".join(WORDS[(k * 7 + j * 3) % len(WORDS)] for j in range(8 + k % 9)) + f" {k}." for k in range(1200)]


def shard_prefixes(dataset: Path) -> list[Path]:
    manifest = json.loads((dataset / "manifest.json").read_text(encoding="utf-8"))
    return [dataset / entry["name"] for entry in manifest["shards"]]


def header_bytes(prefix: Path) -> bytes:
    return Path(f"{prefix}.index").read_bytes()[:64]


def compression_of(prefix: Path) -> int:
    return header_bytes(prefix)[COMPRESSION_BYTE]


def dictionary_size_of(prefix: Path) -> int:
    return struct.unpack_from("<I", header_bytes(prefix), DICTIONARY_SIZE_AT)[0]


def write_jsonl(path: Path, texts: list[str]) -> Path:
    path.write_text("".join(json.dumps({"text": text}) + "\n" for text in texts), encoding="utf-8")
    return path


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize(("compression", "expected"), [("zstd", 1), ("zstd-dict", 2)])
def test_convert_compression_stores_every_shard_compressed_and_reads_back_the_lines(
    capsys, tmp_path, workers, compression, expected
):
    source = write_jsonl(tmp_path / "docs.jsonl", TEXTS)
    code, _, err = run(capsys, "convert", source, tmp_path / "out", "--field", "text", "--compression", compression,
                         "--max-shard-records", "300", "--workers", workers)
    assert code == 0, err
    prefixes = shard_prefixes(tmp_path / "out")
    assert len(prefixes) >= 4
    # zstd-dict trains a dictionary of a tenth of a shard's sample, at least 1 KiB: a smaller shard (the last of a
    # part) is stored with plain zstd instead, as docs/compression.md says.
    records = [entry["records"] for entry in json.loads((tmp_path / "out" / "manifest.json").read_text())["shards"]]
    starts = [sum(records[:k]) for k in range(len(records) + 1)]
    trainable = [raw_bytes(TEXTS[start:stop]) >= 10 << 10 for start, stop in itertools.pairwise(starts)]
    assert sum(trainable) >= 3
    assert [compression_of(prefix) for prefix in prefixes] == [expected if big else 1 for big in trainable]
    with varstore.open(tmp_path / "out") as dataset:
        dataset.verify()
        assert list(dataset) == TEXTS


def test_convert_without_compression_writes_uncompressed_shards(capsys, tmp_path):
    source = write_jsonl(tmp_path / "docs.jsonl", TEXTS)
    code, _, err = run(capsys, "convert", source, tmp_path / "out", "--field", "text")
    assert code == 0, err
    assert [compression_of(prefix) for prefix in shard_prefixes(tmp_path / "out")] == [0]


def metadata_of(prefix: Path) -> dict:
    """The shard's metadata block (§1.4), read from its index: header bytes 32-39 give its size."""
    size = struct.unpack_from("<Q", header_bytes(prefix), 32)[0]
    return json.loads(Path(f"{prefix}.index").read_bytes()[64 : 64 + size])


def test_convert_function_passes_compression_and_level_to_every_shard(tmp_path):
    source = write_jsonl(tmp_path / "docs.jsonl", TEXTS)
    assert convert(source, tmp_path / "out", field="text", compression="zstd", compression_level=19,
                   max_shard_records=600) == len(TEXTS)
    prefixes = shard_prefixes(tmp_path / "out")
    assert len(prefixes) == 2
    assert [compression_of(prefix) for prefix in prefixes] == [1, 1]
    assert [metadata_of(prefix)["compression"] for prefix in prefixes] == [{"name": "zstd", "level": 19}] * 2
    assert list(varstore.open(tmp_path / "out")) == TEXTS


def test_convert_refuses_a_level_out_of_range_before_writing_anything(capsys, tmp_path):
    source = write_jsonl(tmp_path / "docs.jsonl", TEXTS)
    code, _, err = run(capsys, "convert", source, tmp_path / "out", "--field", "text", "--compression", "zstd",
                       "--compression-level", "20")
    assert code != 0
    assert "compression_level must be an integer from 1 to 19, not 20" in err
    assert not (tmp_path / "out").exists()


def test_convert_refuses_a_compression_it_does_not_know(capsys, tmp_path):
    source = write_jsonl(tmp_path / "docs.jsonl", TEXTS)
    code, _, err = run(capsys, "convert", source, tmp_path / "out", "--field", "text", "--compression", "lz4")
    assert code == 2 and "invalid choice: 'lz4'" in err
    with pytest.raises(VarstoreError, match="compression must be None, 'zstd', 'zstd-dict', 'zstd-blocks', 'zstd-dict-blocks' or 'auto', not 'gzip'"):
        convert(source, tmp_path / "out", field="text", compression="gzip")
    assert not (tmp_path / "out").exists()


# -- info, stats, dump, verify -------------------------------------------------------------------------------


@pytest.fixture
def compressed_dataset(tmp_path: Path) -> Path:
    """Three zstd-dict shards of 400 of TEXTS each, as `ShardedWriter` writes them."""
    with varstore.ShardedWriter(tmp_path / "ds", "str", compression="zstd-dict", max_shard_records=400) as writer:
        writer.extend(TEXTS)
    return tmp_path / "ds"


def raw_bytes(texts: list[str]) -> int:
    return sum(len(text.encode("utf-8")) for text in texts)


def test_info_gives_each_shards_compression_dictionary_and_stored_to_raw_ratio(capsys, compressed_dataset):
    prefixes = shard_prefixes(compressed_dataset)
    assert len(prefixes) == 3
    stored = [os.path.getsize(f"{prefix}.data") for prefix in prefixes]
    raw = [raw_bytes(TEXTS[400 * k : 400 * (k + 1)]) for k in range(3)]
    dictionaries = [dictionary_size_of(prefix) for prefix in prefixes]
    assert all(dictionaries) and [compression_of(prefix) for prefix in prefixes] == [2, 2, 2]
    facts = run_json(capsys, "info", compressed_dataset)
    assert (facts["compression"], facts["dictionary_size"], facts["raw_size"]) == ("zstd-dict", sum(dictionaries), sum(raw))
    assert facts["ratio"] == pytest.approx(sum(stored) / sum(raw))
    assert facts["format_version"] == [2, 0]
    shards = [(shard["compression"], shard["dictionary_size"], shard["data_size"], shard["raw_size"], shard["ratio"])
              for shard in facts["shards"]]
    assert shards == [("zstd-dict", size, data, decoded, pytest.approx(data / decoded))
                      for size, data, decoded in zip(dictionaries, stored, raw)]
    code, out, err = run(capsys, "info", compressed_dataset)
    assert code == 0, err
    line = next(line for line in out.splitlines() if line.startswith("stored "))
    assert "zstd-dict (dictionaries " in line and f"data {sum(stored) / sum(raw):.3f} of the " in line
    rows = [line.split() for line in out.splitlines() if line.strip().startswith("shard-")]
    assert [row[-1] for row in rows] == [f"{data / decoded:.3f}" for data, decoded in zip(stored, raw)]
    assert [row[-4] for row in rows] == ["zstd-dict"] * 3


def test_info_at_a_url_reads_each_compressed_shards_decoded_sizes(capsys, s3_server):
    url = f"s3://{s3_server.new_bucket()}/texts"
    with varstore.ShardedWriter(url, "str", compression="zstd", max_shard_records=500,
                                storage_options=s3_server.storage_options) as writer:
        writer.extend(TEXTS)
    facts = run_json(capsys, "info", url, "--storage-options", json.dumps(s3_server.storage_options))
    raw = [raw_bytes(TEXTS[start : start + 500]) for start in range(0, len(TEXTS), 500)]
    assert [(shard["compression"], shard["raw_size"]) for shard in facts["shards"]] == [("zstd", size) for size in raw]
    assert facts["raw_size"] == raw_bytes(TEXTS) and facts["ratio"] == pytest.approx(facts["data_size"] / raw_bytes(TEXTS))


def test_info_of_one_compressed_shard_counts_the_sizes_its_records_decode_to(capsys):
    name = "zstd-str-documents"
    described = json.loads((COMPRESSED / f"{name}.json").read_text(encoding="utf-8"))
    raw = raw_bytes(described["records"])
    facts = run_json(capsys, "info", COMPRESSED / name)
    assert (facts["compression"], facts["dictionary_size"], facts["raw_size"]) == ("zstd", 0, raw)
    assert facts["ratio"] == pytest.approx(os.path.getsize(COMPRESSED / f"{name}.data") / raw)
    assert facts["format_version"] == [2, 0]


def test_info_of_an_uncompressed_dataset_says_none_with_a_ratio_of_one(capsys, tmp_path):
    with varstore.ShardedWriter(tmp_path / "ds", "str") as writer:
        writer.extend(TEXTS)
    facts = run_json(capsys, "info", tmp_path / "ds")
    assert (facts["compression"], facts["dictionary_size"], facts["raw_size"], facts["ratio"]) == ("none", 0, raw_bytes(TEXTS), 1.0)
    assert facts["format_version"] == [1, 1]


def test_stats_gives_each_shards_stored_and_raw_bytes(capsys, compressed_dataset):
    prefixes = shard_prefixes(compressed_dataset)
    facts = run_json(capsys, "stats", compressed_dataset)
    assert facts["total_bytes"] == raw_bytes(TEXTS)
    expected = []
    for k, prefix in enumerate(prefixes):
        stored, raw = os.path.getsize(f"{prefix}.data"), raw_bytes(TEXTS[400 * k : 400 * (k + 1)])
        expected.append({"name": prefix.name, "compression": "zstd-dict", "stored_bytes": stored, "raw_bytes": raw,
                         "ratio": pytest.approx(stored / raw)})
    assert facts["shards"] == expected
    code, out, err = run(capsys, "stats", compressed_dataset)
    assert code == 0, err
    rows = [line.split() for line in out.splitlines() if line.strip().startswith("shard-")]
    assert [row[-1] for row in rows] == [f"{shard['stored_bytes'] / shard['raw_bytes']:.3f}" for shard in expected]


def test_dump_prints_the_decompressed_records(capsys, compressed_dataset):
    code, out, err = run(capsys, "dump", compressed_dataset, "--range", "398:402", "--json")
    assert code == 0, err
    assert [json.loads(line) for line in out.splitlines()] == [
        {"index": index, "size": len(TEXTS[index].encode("utf-8")), "record": TEXTS[index]} for index in range(398, 402)
    ]


def test_verify_passes_an_intact_compressed_dataset(capsys, compressed_dataset):
    code, out, err = run(capsys, "verify", compressed_dataset)
    assert code == 0, out + err


def test_verify_finds_a_frame_that_decodes_wrong_though_its_checksum_matches(capsys, tmp_path):
    """The damaged case's record 1 has its CRC32C (over the stored bytes, recomputed here with the spec reader's own
    CRC) but its frame decodes to more bytes than it declares: only decoding every frame finds it."""
    shard = tmp_path / "shard"
    for suffix in (".data", ".index"):
        shutil.copy(COMPRESSED / "damaged" / "frame-decodes-to-more-than-declared" / f"shard{suffix}", f"{shard}{suffix}")
    index = Path(f"{shard}.index").read_bytes()
    data = Path(f"{shard}.data").read_bytes()
    count, metadata_size = struct.unpack_from("<Q", index, 16)[0], struct.unpack_from("<Q", index, 32)[0]
    dictionary_size = struct.unpack_from("<I", index, DICTIONARY_SIZE_AT)[0]
    offsets_start = -(-(-(-(64 + metadata_size) // 8) * 8 + dictionary_size) // 8) * 8
    offsets = struct.unpack_from(f"<{count + 1}Q", index, offsets_start)
    checksums = struct.unpack_from(f"<{count}I", index, offsets_start + 8 * (count + 1))
    assert [spec_reader.crc32c(data[start:end]) for start, end in itertools.pairwise(offsets)] == list(checksums)
    report = run_json(capsys, "verify", shard, expected_code=1)
    assert json.dumps(report).count("does not decode") == 1 and "checksum" not in json.dumps(report)
    code, out, err = run(capsys, "verify", shard)
    assert code == 1
    assert "1 record does not decode: 1" in out + err


# -- without the zstd extra ----------------------------------------------------------------------------------

_WITHOUT_ZSTANDARD = """
import sys
sys.modules["zstandard"] = None  # import zstandard now raises ImportError, as where the extra is not installed
import varstore
from varstore.errors import VarstoreError
with varstore.open(sys.argv[2]) as plain:
    assert plain[0] == "plain", plain[0]
try:
    varstore.open(sys.argv[1])
except VarstoreError as error:
    print(error)
else:
    raise SystemExit("a compressed shard opened without zstandard")
from varstore.cli import main
sys.exit(main(["dump", sys.argv[1], "--head", "1"]))
"""


def test_a_compressed_shard_without_zstandard_is_one_error_naming_the_extra(tmp_path):
    with varstore.Writer(tmp_path / "plain", "str") as writer:
        writer.append("plain")
    child = subprocess.run(
        [sys.executable, "-c", _WITHOUT_ZSTANDARD, str(COMPRESSED / "zstd-str-documents"), str(tmp_path / "plain")],
        capture_output=True, text=True, timeout=600, cwd=ROOT, check=False,
    )
    assert child.returncode == 1, child.stdout + child.stderr
    assert "pip install 'varstore[zstd]'" in child.stdout
    errors = child.stderr.strip().splitlines()
    assert len(errors) == 1 and "pip install 'varstore[zstd]'" in errors[0] and "Traceback" not in child.stderr

"""Round 3 attacks on compression where users meet it (absurd levels, a level without a compression, levels across
--workers) and on per-batch read planning (offsets at the 64-bit edge, every kind of non-offset). Tests of real
bugs are strict xfails naming what should happen."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("zstandard", reason="compressed shards need the zstd extra: pip install -e '.[zstd]'")

import numpy as np

import varstore
from tests.helpers_cli import run
from tests.test_compression_cli import TEXTS, metadata_of, shard_prefixes, write_jsonl
from varstore.conversion import convert
from varstore.errors import VarstoreError
from varstore.remote.read_plan import ObjectRanges, cut_pieces, plan_reads


@pytest.mark.parametrize("level", ["0", "-1", "20", str(10**30), "3.5", "1e3", "abc", ""])
def test_an_absurd_compression_level_is_refused_before_the_destination_is_made(capsys, tmp_path, level):
    source = write_jsonl(tmp_path / "docs.jsonl", TEXTS[:50])
    code, out, err = run(capsys, "convert", source, tmp_path / "out", "--field", "text", "--compression", "zstd",
                         f"--compression-level={level}")
    assert code != 0 and out == ""
    assert "compression-level" in err or "compression_level" in err
    assert "Traceback" not in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("level", [True, 3.0, "3", 10**30, -(2**63), None])
def test_convert_refuses_a_compression_level_that_is_no_level(tmp_path, level):
    source = write_jsonl(tmp_path / "docs.jsonl", TEXTS[:50])
    with pytest.raises(VarstoreError, match="compression_level must be an integer from 1 to 19"):
        convert(source, tmp_path / "out", field="text", compression="zstd", compression_level=level)
    assert not (tmp_path / "out").exists()


def test_a_compression_level_without_a_compression_is_refused(capsys, tmp_path):
    source = write_jsonl(tmp_path / "docs.jsonl", TEXTS[:50])
    code, _, err = run(capsys, "convert", source, tmp_path / "out", "--field", "text", "--compression-level", "9")
    assert code != 0
    assert "--compression" in err


@pytest.mark.parametrize("compression", ["zstd", "zstd-dict"])
def test_every_shard_of_every_worker_records_the_level_asked_for(capsys, tmp_path, compression):
    source = write_jsonl(tmp_path / "docs.jsonl", TEXTS)
    code, _, err = run(capsys, "convert", source, tmp_path / "out", "--field", "text", "--compression", compression,
                       "--compression-level", "15", "--max-shard-records", "300", "--workers", "2")
    assert code == 0, err
    levels = {json.dumps(metadata_of(prefix)["compression"], sort_keys=True) for prefix in shard_prefixes(tmp_path / "out")}
    # docs/compression.md: a dictionary shard is compressed 3 levels higher, at most 19; a shard too small to train
    # a dictionary on is plain zstd at the level given.
    allowed = {json.dumps({"name": "zstd", "level": 15}, sort_keys=True)}
    if compression == "zstd-dict":
        assert any('"zstd-dict"' in level for level in levels)
        assert all('"level": 18' in level or level in allowed for level in levels)
    else:
        assert levels == allowed
    with varstore.open(tmp_path / "out") as dataset:
        assert list(dataset) == TEXTS


def test_ranges_at_the_64_bit_edge_plan_one_request_and_come_back_exact():
    size = 2**64 - 1
    ranges = [(size - 5, size), (size - 3, size - 1), (size, size), (0, 2)]
    plan = plan_reads([ObjectRanges("edge", size, ranges)])
    assert [(request.start, request.end) for request in plan.requests] == [(0, 2), (size - 5, size)]
    bodies = [b"ab", b"vwxyz"]  # the object's first two and last five bytes
    assert cut_pieces(plan, bodies) == [[b"vwxyz", b"xy", b"", b"ab"]]


def test_a_range_of_numpy_uint64_offsets_past_int64_is_an_offset():
    size = 2**64 - 1
    start = np.uint64(2**63 + 10)
    plan = plan_reads([ObjectRanges("edge", size, [(start, start + np.uint64(4))])])
    assert [(request.start, request.end) for request in plan.requests] == [(2**63 + 10, 2**63 + 14)]


@pytest.mark.parametrize("bad", [(-1, 3), (3, 2), (0, 2**64), (2**70, 2**70 + 1), (0.0, 3), (True, 3), ("0", "3"),
                                 (None, 3), (0, float("inf")), (np.float64(1), 3)])
def test_an_absurd_range_is_refused_before_any_request_naming_the_object(bad):
    good = ObjectRanges("fine", 100, [(0, 10)])
    with pytest.raises(VarstoreError, match="absurd"):
        plan_reads([good, ObjectRanges("absurd", 2**64 - 1, [(0, 1), bad])])


@pytest.mark.parametrize(("request_bytes", "max_gap"), [(0, 0), (-5, 0), (1, -1)])
def test_a_plan_with_no_room_for_a_byte_is_a_value_error(request_bytes, max_gap):
    with pytest.raises(ValueError, match="request_bytes must be positive"):
        plan_reads([ObjectRanges("x", 10, [(0, 10)])], request_bytes=request_bytes, max_gap=max_gap)


@pytest.mark.parametrize("level", [0, 20, 10**30, True, "3"])
def test_spark_refuses_an_absurd_level_before_any_task_or_destination(tmp_path, level):
    pytest.importorskip("pyspark")
    from varstore.engines.spark import write_dataframe

    class NoRowsEver:
        """A DataFrame stand-in with a column: any job it ran would fail, so the refusal comes first."""

        columns = ("text",)

    with pytest.raises(VarstoreError, match="compression_level must be an integer from 1 to 19"):
        write_dataframe(NoRowsEver(), str(tmp_path / "out"), column="text", compression="zstd", compression_level=level)
    assert not (tmp_path / "out").exists()


def test_threads_sharing_one_dictionarys_decompressor_each_read_their_own_records(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    source = write_jsonl(tmp_path / "docs.jsonl", TEXTS)
    convert(source, tmp_path / "out", field="text", compression="zstd-dict", max_shard_records=600)
    assert any(metadata_of(prefix)["compression"]["name"] == "zstd-dict" for prefix in shard_prefixes(tmp_path / "out"))
    with varstore.open(tmp_path / "out") as dataset:
        def read_stride(start: int) -> list[tuple[int, str]]:
            return [(i, dataset[i]) for i in range(start, len(TEXTS), 7)] + \
                [(i, text) for i, text in zip(range(start, len(TEXTS), 13), dataset.get_batch(range(start, len(TEXTS), 13)))]

        with ThreadPoolExecutor(max_workers=7) as pool:
            read = [pair for pairs in pool.map(read_stride, range(7)) for pair in pairs]
    assert all(text == TEXTS[i] for i, text in read)
    assert len(read) == sum(len(range(start, len(TEXTS), 7)) + len(range(start, len(TEXTS), 13)) for start in range(7))

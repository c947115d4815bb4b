"""BlendedDataset over real varstore sources: paths, RecordDataset and TokenWindowDataset, DataLoader workers under
fork and spawn, and a 2-rank gloo group whose ranks together read exactly the blend's first N samples."""

from __future__ import annotations

import json
from fractions import Fraction

import numpy as np
import pytest
import torch
import torch.distributed
import torch.multiprocessing
from torch.utils.data import DataLoader, DistributedSampler

import varstore
from varstore import VarstoreError
from varstore.torch import (
    BlendedDataset,
    ExactlyOnceSampler,
    JaggedBatch,
    RecordDataset,
    TokenWindowDataset,
    collate_jagged,
)

from .test_torch_distributed import _free_port

CODE_OFFSET = 1000
SCHEDULE = [(0, {"web": 3, "code": 1}), (50, {"web": 1, "code": 2})]
SAMPLES = 101


def write_numbered(path, count: int, offset: int = 0) -> None:
    """Record i is ``1 + i % 3`` int32 copies of ``offset + i``, so a sample names its source and record."""
    with varstore.ShardedWriter(path, codec="ndarray", dtype="int32", max_shard_records=16) as writer:
        writer.extend(np.full(1 + index % 3, offset + index, np.int32) for index in range(count))


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("blend")
    write_numbered(root / "web", 40)
    write_numbered(root / "code", 13, CODE_OFFSET)
    return {"web": str(root / "web"), "code": str(root / "code")}


def expected_ids(blend: BlendedDataset, count: int) -> list[int]:
    """What sample k must hold, from `locate` alone: the record number, offset for code."""
    located = [blend.locate(sample) for sample in range(count)]
    return [record + (CODE_OFFSET if name == "code" else 0) for name, record in located]


def batch_ids(batch: JaggedBatch) -> list[int]:
    """The id of each sample of a jagged batch, checking the sample is whole."""
    ids = []
    for start, stop in zip(batch.offsets[:-1].tolist(), batch.offsets[1:].tolist()):
        sample = batch.values[start:stop].tolist()
        assert sample == [sample[0]] * (1 + (sample[0] % CODE_OFFSET) % 3)
        ids.append(sample[0])
    return ids


def test_sources_given_as_paths_read_the_located_records(sources):
    blend = BlendedDataset(sources, SCHEDULE, num_samples=SAMPLES, seed=3)
    assert all(isinstance(source, RecordDataset) for source in blend.sources)
    samples = blend.__getitems__(list(range(SAMPLES)))
    assert [int(sample[0]) for sample in samples] == expected_ids(blend, SAMPLES)
    assert all(sample.dtype == torch.int64 for sample in samples)


def test_token_windows_and_records_blend_into_the_located_samples(sources, tmp_path):
    with varstore.Writer(tmp_path / "tokens", codec="ndarray", dtype="uint16") as writer:
        writer.extend(np.arange(start, start + 7, dtype=np.uint16) for start in range(0, 70, 7))
    windows = TokenWindowDataset(tmp_path / "tokens", seq_len=4)
    records = RecordDataset(sources["web"])
    blend = BlendedDataset({"tokens": windows, "docs": records}, {"tokens": 2, "docs": 1}, num_samples=60)
    for sample, value in zip(range(60), blend.__getitems__(list(range(60)))):
        name, record = blend.locate(sample)
        expected = windows[record] if name == "tokens" else records[record]
        assert torch.equal(value, expected)
    assert blend.describe(60)["tokens"].epoch == 40 // len(windows)


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_dataloader_workers_under_fork_and_spawn_yield_the_blend_in_order(sources, context):
    blend = BlendedDataset(sources, SCHEDULE, num_samples=SAMPLES, seed=3)
    loader = DataLoader(
        blend,
        batch_size=8,
        sampler=ExactlyOnceSampler(blend, shuffle=False),
        collate_fn=collate_jagged,
        num_workers=2,
        multiprocessing_context=context,
        timeout=60,
    )
    assert [sample for batch in loader for sample in batch_ids(batch)] == expected_ids(blend, SAMPLES)


def _read_on_rank(rank: int, address: str, source_paths: dict[str, str], results_path: str) -> None:
    torch.distributed.init_process_group("gloo", init_method=address, rank=rank, world_size=2)
    blend = BlendedDataset(source_paths, SCHEDULE, num_samples=SAMPLES, seed=3)
    samplers = {"exactly_once": ExactlyOnceSampler(blend, shuffle=False), "stock": DistributedSampler(blend, shuffle=False)}
    seen = {
        name: [sample for batch in DataLoader(blend, 8, sampler=sampler, collate_fn=collate_jagged) for sample in batch_ids(batch)]
        for name, sampler in samplers.items()
    }
    everyone: list[dict[str, list[int]] | None] = [None, None]
    torch.distributed.all_gather_object(everyone, seen)
    if rank == 0:
        with open(results_path, "w") as file:
            json.dump(everyone, file)
    torch.distributed.destroy_process_group()


def test_two_gloo_ranks_together_read_exactly_the_blends_first_samples(sources, tmp_path):
    results = tmp_path / "seen.json"
    address = f"tcp://127.0.0.1:{_free_port()}"
    torch.multiprocessing.spawn(_read_on_rank, args=(address, sources, str(results)), nprocs=2)
    by_rank = json.loads(results.read_text())
    blend = BlendedDataset(sources, SCHEDULE, num_samples=SAMPLES, seed=3)
    expected = expected_ids(blend, SAMPLES)
    # Rank r reads samples r, r + 2, ...: interleaving the ranks gives the blend in order.
    ranks = [by_rank[rank]["exactly_once"] for rank in range(2)]
    assert len(ranks[0]) == 51 and len(ranks[1]) == 50
    interleaved = [sample for pair in zip(*ranks) for sample in pair] + ranks[0][50:]
    assert interleaved == expected
    # The stock sampler pads the last rank with sample 0 to even out the ranks.
    stock = by_rank[0]["stock"] + by_rank[1]["stock"]
    assert sorted(stock) == sorted(expected + [expected[0]])


def test_megatrons_data_path_spelling_blends_the_paths_by_their_exact_decimal_weights(sources):
    spelled = BlendedDataset.from_data_path(f"0.3 {sources['web']} 0.7 {sources['code']}", num_samples=60, seed=2)
    explicit = BlendedDataset(
        {path: path for path in sources.values()},
        {sources["web"]: Fraction(3, 10), sources["code"]: Fraction(7, 10)},
        num_samples=60,
        seed=2,
    )
    assert [spelled.locate(sample) for sample in range(60)] == [explicit.locate(sample) for sample in range(60)]
    assert spelled.describe(60)[sources["web"]].samples == 18
    alone = BlendedDataset.from_data_path([sources["code"]], num_samples=5)
    assert {name for name, _ in map(alone.locate, range(5))} == {sources["code"]}


@pytest.mark.parametrize(
    ("spelling", "message"), [("0.3 a 0.7", "weight path weight path"), ("x a 1 b", "not a number"), ("1 a 2 a", "twice")]
)
def test_a_malformed_data_path_is_refused_saying_what_was_expected(spelling, message):
    with pytest.raises(VarstoreError, match=message):
        BlendedDataset.from_data_path(spelling, num_samples=5)

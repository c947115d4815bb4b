"""Resume at another world size and worker count: a checkpoint of 4 ranks x 2 workers goes on at 2 ranks x 3 workers,
then at 8 ranks x 1, and every record (every blend sample) of the epoch comes exactly once; any rank's state serves
every rank, with no merge step. Ranks and workers are simulated in-process, and once with a real gloo group."""

from __future__ import annotations

import json
import socket

import pytest
import torch.distributed
import torch.multiprocessing
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader

from varstore.torch import BlendedDataset, ExactlyOnceSampler, RecordDataset, RecordStream, collate_jagged

from .helpers_torch import batch_indices, write_indexed_dataset
from .test_torch_stream import delivered, first_values

RECORDS = 211
STAGES = ((4, 2), (2, 3), (8, 1))  # (world size, workers) of each run of the epoch


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    root = tmp_path_factory.mktemp("world-size")
    write_indexed_dataset(root / "data", RECORDS, max_shard_records=30)
    return root / "data"


def _stream(path, rank: int, world_size: int, batch_size: int, **options) -> RecordStream:
    return RecordStream(path, batch_size=batch_size, collate_fn=first_values, output="numpy", seed=5, rank=rank,
                        world_size=world_size, **options)


def _stream_epoch(path, batch_size: int, steps: list[int], **options) -> list[int]:
    """Every record each run of STAGES reads, each run stopped after its `steps` batches per rank (the last runs
    to the end), resumed from rank 0's state, which every rank's equals."""
    read, state = [], None
    for (world_size, workers), stop in zip(STAGES, steps + [None]):
        streams = [_stream(path, rank, world_size, batch_size, **options) for rank in range(world_size)]
        for stream in streams:
            if state is not None:
                stream.load_state_dict(state)
        batches = [delivered(stream, workers) for stream in streams]
        if stop is not None:
            stop = min(stop, *(len(rank_batches) for rank_batches in batches))
        for rank_batches in batches:
            read += [record for batch in rank_batches[:stop] for record in batch]
        if stop is not None:
            states = [json.loads(json.dumps(stream.state_dict(stop * batch_size))) for stream in streams]
            assert all(each == states[0] for each in states)
            state = states[0]
    return read


def test_a_stream_resumed_at_2x3_then_8x1_reads_every_record_once(path):
    assert sorted(_stream_epoch(path, 4, [3, 2], block_size=8, shuffle_window=16)) == list(range(RECORDS))


@settings(max_examples=15)
@given(
    batch_size=st.integers(1, 9), block_size=st.integers(1, 20), shuffle_window=st.integers(1, 40),
    shuffle=st.booleans(), steps=st.lists(st.integers(0, 12), min_size=2, max_size=2),
)
def test_a_stream_resumed_at_other_world_sizes_reads_every_record_once(path, batch_size, block_size, shuffle_window,
                                                                       shuffle, steps):
    read = _stream_epoch(path, batch_size, steps, block_size=block_size, shuffle_window=shuffle_window, shuffle=shuffle)
    assert sorted(read) == list(range(RECORDS))


def test_a_stream_resumed_at_the_same_world_size_keeps_its_order(path):
    whole = [delivered(_stream(path, rank, 2, 4), 2) for rank in range(2)]
    resumed = []
    for rank in range(2):
        stream = _stream(path, rank, 2, 4)
        stream.load_state_dict(_stream(path, 0, 2, 4).state_dict(3 * 4))
        resumed.append(delivered(stream, 3))
    assert resumed == [rank_batches[3:] for rank_batches in whole]


def _sampled_epoch(size: int, batch_size: int, steps: list[int], data_source, **options) -> list[int]:
    """The indices the ranks of each run of STAGES consume (batches of `batch_size`), resumed from rank 0's state."""
    read, state = [], None
    for (world_size, _), stop in zip(STAGES, steps + [None]):
        samplers = [ExactlyOnceSampler(data_source, rank=rank, world_size=world_size, **options)
                    for rank in range(world_size)]
        for sampler in samplers:
            if state is not None:
                sampler.load_state_dict(state)
        for sampler in samplers:
            read += list(sampler)[: None if stop is None else stop * batch_size]
        if stop is not None:
            states = [sampler.state_dict(stop * batch_size) for sampler in samplers]
            assert all(each == states[0] for each in states)
            state = states[0]
    assert len(read) == size
    return read


@pytest.mark.parametrize("options", [{"seed": 1}, {"seed": 2, "block_size": 8}, {"shuffle": False}])
def test_a_sampler_resumed_at_2_then_8_ranks_yields_every_index_once(path, options):
    dataset = RecordDataset(path)
    assert sorted(_sampled_epoch(RECORDS, 4, [3, 5], dataset, **options)) == list(range(RECORDS))


def test_a_blend_sampled_and_resumed_at_other_world_sizes_yields_every_sample_once(path):
    blend = BlendedDataset({"a": path, "b": path}, {"a": 1, "b": 3}, num_samples=500, seed=9)
    samples = _sampled_epoch(500, 4, [7, 4], blend, shuffle=False)
    assert sorted(samples) == list(range(500))
    expected = sorted(blend.locate(sample) for sample in range(500))
    assert sorted(blend.locate(sample) for sample in samples) == expected


# A real process group: 2 ranks (gloo) x 2 forked workers read 3 batches with a plain DataLoader; their states,
# gathered, are equal; the epoch then goes on at 3 ranks x 1 worker.
GLOO_RANKS = 2


def _checkpoint_by_rank(rank: int, address: str, path: str, results: str) -> None:
    torch.distributed.init_process_group("gloo", init_method=address, rank=rank, world_size=GLOO_RANKS)
    stream = RecordStream(path, batch_size=4, block_size=8, shuffle_window=16, collate_fn=collate_jagged, seed=5,
                          output="numpy")
    loader = DataLoader(stream, batch_size=None, num_workers=2, multiprocessing_context="fork")
    read = []
    for batch in loader:
        read += batch_indices(batch)
        if len(read) == 3 * 4:
            break
    everyone: list[object] = [None] * GLOO_RANKS
    torch.distributed.all_gather_object(everyone, {"read": read, "state": stream.state_dict(len(read))})
    if rank == 0:
        with open(results, "w") as file:
            json.dump(everyone, file)
    torch.distributed.destroy_process_group()


def test_a_gloo_checkpoint_of_2_ranks_resumes_at_3_ranks_with_every_record_once(path, tmp_path):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        address = f"tcp://127.0.0.1:{probe.getsockname()[1]}"
    results = tmp_path / "ranks.json"
    torch.multiprocessing.spawn(_checkpoint_by_rank, args=(address, str(path), str(results)), nprocs=GLOO_RANKS)
    by_rank = json.loads(results.read_text())
    assert by_rank[0]["state"] == by_rank[1]["state"]
    read = [record for rank in by_rank for record in rank["read"]]
    for rank in range(3):
        stream = _stream(path, rank, 3, 4, block_size=8, shuffle_window=16)
        stream.load_state_dict(by_rank[rank % GLOO_RANKS]["state"])
        read += [record for batch in delivered(stream, 1) for record in batch]
    assert sorted(read) == list(range(RECORDS))


@given(st.integers(0, 10**6), st.integers(1, 5000), st.integers(0, 10**4))
def test_a_stages_consumed_count_in_closed_form_equals_the_sum_over_its_ranks_shares(length, world_size, consumed):
    from varstore.torch.stream import _part, _stage_consumed

    assert _stage_consumed(length, world_size, consumed) == sum(
        min(consumed, _part(length, world_size, rank)[1]) for rank in range(world_size))

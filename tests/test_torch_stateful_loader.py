"""torchdata's StatefulDataLoader checkpointing varstore's sampler, stream and blend mid-epoch with 2 workers (fork and
spawn): the resumed run yields exactly the batches the uninterrupted one had left, and a state saved on other data is
refused."""

from __future__ import annotations

import pytest

pytest.importorskip("torchdata")

from torchdata.stateful_dataloader import StatefulDataLoader

import varstore
from varstore.torch import BlendedDataset, ExactlyOnceSampler, RecordDataset, RecordStream, collate_jagged

from .helpers_torch import batch_indices, write_indexed_dataset

RECORDS = 97
BATCH = 8
TAKEN = 5  # batches before the checkpoint: worker 0 has yielded 3 of them, worker 1 two


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("stateful")
    write_indexed_dataset(root / "data", RECORDS, max_shard_records=20)
    write_indexed_dataset(root / "other", RECORDS + 3, max_shard_records=20)
    return root


def _stream(path) -> RecordStream:
    return RecordStream(path, batch_size=BATCH, block_size=4, shuffle_window=16, collate_fn=collate_jagged,
                        output="numpy", seed=7, rank=0, world_size=1)


def _sampled(path, seed=3):
    dataset = RecordDataset(path, output="numpy")
    return dataset, ExactlyOnceSampler(dataset, seed=seed, rank=0, world_size=1)


def _loader(kind: str, path, context: str) -> StatefulDataLoader:
    workers = {"num_workers": 2, "multiprocessing_context": context}
    if kind == "stream":
        return StatefulDataLoader(_stream(path), batch_size=None, **workers)
    if kind == "sampler":
        dataset, sampler = _sampled(path)
        return StatefulDataLoader(dataset, BATCH, sampler=sampler, collate_fn=collate_jagged, **workers)
    blend = BlendedDataset({"a": RecordDataset(path, output="numpy")}, {"a": 1}, num_samples=2 * RECORDS + 5, seed=2)
    return StatefulDataLoader(blend, BATCH, sampler=ExactlyOnceSampler(blend, shuffle=False, rank=0, world_size=1),
                              collate_fn=collate_jagged, **workers)


# Spawned workers re-import torch (~20 s a loader here): spawn is run for the stream, whose state lives in the workers.
@pytest.mark.parametrize(("kind", "context"), [("stream", "fork"), ("sampler", "fork"), ("blend", "fork"),
                                               ("stream", "spawn")])
def test_a_run_checkpointed_mid_epoch_resumes_with_the_batches_it_had_left(data, kind, context):
    uninterrupted = [batch_indices(batch) for batch in _loader(kind, data / "data", context)]
    interrupted = _loader(kind, data / "data", context)
    taken = []
    for batch in interrupted:  # the loader's workers have run ahead of these batches when the state is taken
        taken.append(batch_indices(batch))
        if len(taken) == TAKEN:
            break
    state = interrupted.state_dict()
    del interrupted
    resumed = _loader(kind, data / "data", context)
    resumed.load_state_dict(state)
    rest = [batch_indices(batch) for batch in resumed]
    assert taken + rest == uninterrupted
    if kind != "blend":  # a blend of 2 epochs of its one source holds each record twice
        assert sorted(index for batch in taken + rest for index in batch) == list(range(RECORDS))


def test_a_stream_worker_state_names_its_worker_and_the_batches_it_yielded(data):
    loader = _loader("stream", data / "data", "fork")
    batches = iter(loader)
    for _ in range(TAKEN):
        next(batches)
    workers = loader.state_dict()["_snapshot"]["_worker_snapshots"]
    states = [workers[f"worker_{worker}"]["dataset_state"] for worker in range(2)]
    assert [(state["worker"], state["workers"], state["worker_batches"]) for state in states] == [(0, 2, 3), (1, 2, 2)]


def test_a_stream_worker_state_is_refused_outside_its_worker(data):
    loader = _loader("stream", data / "data", "fork")
    batches = iter(loader)
    next(batches)
    state = loader.state_dict()["_snapshot"]["_worker_snapshots"]["worker_0"]["dataset_state"]
    refused = "DataLoader worker 0's of 2 at world size 1, batch size 8, loaded in the main process"
    with pytest.raises(varstore.VarstoreError, match=refused):
        _stream(data / "data").load_state_dict(state)


@pytest.mark.parametrize("kind", ["stream", "sampler", "blend"])
def test_a_state_saved_on_one_dataset_is_refused_on_a_rewritten_one(tmp_path, kind):
    write_indexed_dataset(tmp_path / "data", RECORDS, max_shard_records=20)
    if kind == "stream":
        state = _stream(tmp_path / "data").state_dict(BATCH)
    elif kind == "sampler":
        state = _sampled(tmp_path / "data")[1].state_dict(BATCH)
    else:
        state = BlendedDataset({"a": tmp_path / "data"}, {"a": 1}, num_samples=RECORDS).state_dict()
    write_indexed_dataset(tmp_path / "new", RECORDS, max_shard_records=10)  # the same records, in other shards
    (tmp_path / "data").rename(tmp_path / "old")
    (tmp_path / "new").rename(tmp_path / "data")
    with pytest.raises(varstore.VarstoreError, match="made on dataset version [0-9a-f]+, this is version [0-9a-f]+"):
        if kind == "stream":
            _stream(tmp_path / "data").load_state_dict(state)
        elif kind == "sampler":
            _sampled(tmp_path / "data")[1].load_state_dict(state)
        else:
            BlendedDataset({"a": tmp_path / "data"}, {"a": 1}, num_samples=RECORDS).load_state_dict(state)


def test_a_state_from_before_versions_were_recorded_still_loads(data):
    sampler = _sampled(data / "data")[1]
    state = sampler.state_dict(BATCH)
    del state["dataset_version"]
    resumed = _sampled(data / "data")[1]
    resumed.load_state_dict(state)
    assert list(resumed) == list(sampler)[BATCH:]


def _ranked_stream(path, rank: int, world_size: int) -> RecordStream:
    return RecordStream(path, batch_size=BATCH, block_size=4, shuffle_window=16, collate_fn=collate_jagged,
                        output="numpy", seed=7, rank=rank, world_size=world_size)


def test_a_loader_state_of_4_ranks_x_2_workers_resumes_a_stream_at_2_ranks_x_3_workers(data):
    read, states = [], []
    for rank in range(4):  # each rank's own loader; ranks step together, 2 batches each
        loader = StatefulDataLoader(_ranked_stream(data / "data", rank, 4), batch_size=None, num_workers=2)
        for step, batch in enumerate(loader, start=1):
            read += batch_indices(batch)
            if step == 2:
                break
        states.append(loader.state_dict())
    for rank in range(2):
        stream = _ranked_stream(data / "data", rank, 2)
        stream.load_state_dict(states[3 - rank])  # any rank's loader state resumes every rank
        read += [index for batch in StatefulDataLoader(stream, batch_size=None, num_workers=3)
                 for index in batch_indices(batch)]
    assert sorted(read) == list(range(RECORDS))


def test_a_loader_state_of_4_ranks_x_2_workers_resumes_a_sampler_at_2_ranks_x_3_workers(data):
    dataset = RecordDataset(data / "data", output="numpy")
    read, states = [], []
    for rank in range(4):
        sampler = ExactlyOnceSampler(dataset, seed=3, rank=rank, world_size=4)
        loader = StatefulDataLoader(dataset, BATCH, sampler=sampler, collate_fn=collate_jagged, num_workers=2)
        for step, batch in enumerate(loader, start=1):
            read += batch_indices(batch)
            if step == 2:
                break
        states.append(loader.state_dict())
    for rank in range(2):
        sampler = ExactlyOnceSampler(dataset, seed=3, rank=rank, world_size=2)
        sampler.load_state_dict(states[rank])
        loader = StatefulDataLoader(dataset, BATCH, sampler=sampler, collate_fn=collate_jagged, num_workers=3)
        read += [index for batch in loader for index in batch_indices(batch)]
    assert sorted(read) == list(range(RECORDS))


def test_a_loader_state_taken_between_snapshots_is_refused(data):
    loader = StatefulDataLoader(_stream(data / "data"), batch_size=None, num_workers=2, snapshot_every_n_steps=4)
    batches = iter(loader)
    for _ in range(TAKEN):
        next(batches)
    with pytest.raises(varstore.VarstoreError, match="taken 1 batches after its last snapshot"):
        _stream(data / "data").load_state_dict(loader.state_dict())

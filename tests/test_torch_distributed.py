"""A real process group (gloo, 2 ranks x 2 DataLoader workers): every record once per epoch, a new order each epoch."""

from __future__ import annotations

import json
import socket

import torch.distributed
import torch.multiprocessing
from torch.utils.data import DataLoader, DistributedSampler

from varstore.torch import ExactlyOnceSampler, RecordDataset, RecordStream, collate_jagged

from .helpers_torch import batch_indices, write_indexed_dataset

RECORDS = 103
WORLD_SIZE = 2
EPOCHS = 2


def _seen_by_rank(rank: int, address: str, dataset_path: str, results_path: str) -> None:
    torch.distributed.init_process_group("gloo", init_method=address, rank=rank, world_size=WORLD_SIZE)
    dataset = RecordDataset(dataset_path, output="numpy")
    exactly_once = ExactlyOnceSampler(dataset, seed=4)
    stock = DistributedSampler(dataset, seed=4)
    stream = RecordStream(
        dataset_path, batch_size=8, block_size=4, shuffle_window=16, collate_fn=collate_jagged, output="numpy"
    )
    # Ranks made by torch.multiprocessing.spawn default to spawning workers too; torchrun's ranks fork them.
    workers = {"num_workers": 2, "multiprocessing_context": "fork"}
    loaders = {
        "sampler": (exactly_once, DataLoader(dataset, 8, sampler=exactly_once, collate_fn=collate_jagged, **workers)),
        "stock": (stock, DataLoader(dataset, 8, sampler=stock, collate_fn=collate_jagged, **workers)),
        "stream": (stream, DataLoader(stream, batch_size=None, **workers)),
    }
    seen: dict[str, list[list[int]]] = {name: [] for name in loaders}
    for epoch in range(EPOCHS):
        for name, (epoch_setter, loader) in loaders.items():
            epoch_setter.set_epoch(epoch)
            seen[name].append([index for batch in loader for index in batch_indices(batch)])
    everyone: list[dict[str, list[list[int]]] | None] = [None] * WORLD_SIZE
    torch.distributed.all_gather_object(everyone, seen)
    if rank == 0:
        with open(results_path, "w") as file:
            json.dump(everyone, file)
    torch.distributed.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_two_ranks_with_two_workers_each_see_every_record_once_per_epoch(tmp_path):
    write_indexed_dataset(tmp_path / "data", RECORDS, max_shard_records=20)
    results = tmp_path / "seen.json"
    address = f"tcp://127.0.0.1:{_free_port()}"
    torch.multiprocessing.spawn(_seen_by_rank, args=(address, str(tmp_path / "data"), str(results)), nprocs=WORLD_SIZE)
    by_rank = json.loads(results.read_text())
    for name in ("sampler", "stream"):
        epochs = [[index for rank in by_rank for index in rank[name][epoch]] for epoch in range(EPOCHS)]
        for seen in epochs:
            assert sorted(seen) == list(range(RECORDS)), name
        assert epochs[0] != epochs[1], name
        assert abs(len(by_rank[0][name][0]) - len(by_rank[1][name][0])) <= 1
    # The stock sampler pads each epoch by repeating indices until the ranks are even: 104 samples, one twice.
    stock = [index for rank in by_rank for index in rank["stock"][0]]
    assert len(stock) == RECORDS + 1 and set(stock) == set(range(RECORDS))

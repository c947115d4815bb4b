"""Resume states hold plain ints whatever integer-like value (numpy integer, 0-d tensor) the loop counted with,
so json.dumps writes them and load_state_dict takes them back; non-integers are refused."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import varstore
from varstore.torch import ExactlyOnceSampler, RecordStream

from .helpers_torch import write_indexed_dataset


@pytest.mark.parametrize("consumed", [np.int64(48), np.uint32(48), torch.tensor(48)], ids=["int64", "uint32", "tensor"])
def test_sampler_state_from_an_integer_like_count_is_plain_json_and_loads(consumed):
    sampler = ExactlyOnceSampler(100, seed=np.int64(3), rank=0, world_size=1)
    state = json.loads(json.dumps(sampler.state_dict(samples_consumed=consumed)))
    resumed = ExactlyOnceSampler(100, seed=3, rank=0, world_size=1)
    resumed.load_state_dict(state)
    assert state["samples_consumed"] == 48 and type(state["seed"]) is int
    assert list(resumed) == list(sampler)[48:]


@pytest.mark.parametrize("consumed", [np.int64(8), torch.tensor(8)], ids=["int64", "tensor"])
def test_stream_state_from_an_integer_like_count_is_plain_json_and_loads(tmp_path, consumed):
    write_indexed_dataset(tmp_path / "data", 40, max_shard_records=15)
    stream = RecordStream(tmp_path / "data", batch_size=4, block_size=np.int64(4), shuffle_window=16, output="numpy")
    state = json.loads(json.dumps(stream.state_dict(samples_consumed=consumed)))
    resumed = RecordStream(tmp_path / "data", batch_size=4, block_size=4, shuffle_window=16, output="numpy")
    resumed.load_state_dict(state)
    assert state["samples_consumed"] == 8 and len(resumed) == len(stream) - 2


def test_state_with_numpy_counts_still_loads():
    sampler = ExactlyOnceSampler(100, rank=0, world_size=1)
    state = {**sampler.state_dict(samples_consumed=10), "epoch": np.int64(0), "samples_consumed": np.int64(10)}
    sampler.load_state_dict(state)
    assert len(sampler) == 90


@pytest.mark.parametrize("consumed", [48.0, True, torch.tensor(48.0), "48"], ids=["float", "bool", "float-tensor", "str"])
def test_non_integer_counts_are_refused(consumed):
    with pytest.raises(varstore.VarstoreError, match="samples_consumed must be an integer"):
        ExactlyOnceSampler(100, rank=0, world_size=1).state_dict(samples_consumed=consumed)

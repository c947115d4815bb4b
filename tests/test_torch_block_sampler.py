"""ExactlyOnceSampler's block shuffle: a bijection built from blocks and windows, local in reads, resumable anywhere."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import varstore
from varstore.torch import ExactlyOnceSampler
from varstore.torch.permutation import BlockShuffle, Permutation, derive_key


def reference_block_shuffle(size: int, block_size: int, shuffle_window: int, key: int) -> list[int]:
    """The order BlockShuffle documents, built the slow way with lists: blocks listed in the keyed order and
    concatenated, then each window of that sequence reordered by its own permutation."""
    blocks = [list(range(start, min(start + block_size, size))) for start in range(0, size, block_size)]
    block_order = Permutation(len(blocks), derive_key(key, 0))(np.arange(len(blocks))).tolist()
    sequence = [record for slot in block_order for record in blocks[slot]]
    order = []
    for window, start in enumerate(range(0, size, shuffle_window)):
        part = sequence[start : start + shuffle_window]
        order += [part[offset] for offset in Permutation(len(part), derive_key(key, 1, window))(np.arange(len(part)))]
    return order


def samplers(size: int, world_size: int, **options) -> list[ExactlyOnceSampler]:
    return [ExactlyOnceSampler(size, rank=rank, world_size=world_size, **options) for rank in range(world_size)]


@given(st.integers(0, 300), st.integers(1, 40), st.integers(1, 60), st.integers(0, 2**64 - 1))
def test_block_shuffle_is_the_documented_order_with_a_short_last_block_and_window(size, block_size, window, key):
    order = BlockShuffle(size, block_size, window, key)(np.arange(size)).tolist()
    assert order == reference_block_shuffle(size, block_size, window, key)


@given(st.integers(0, 400), st.integers(1, 50), st.integers(1, 80), st.integers(1, 6), st.integers(0, 3))
def test_ranks_together_see_every_record_once_under_the_block_shuffle(size, block_size, window, world_size, epoch):
    parts = []
    for sampler in samplers(size, world_size, seed=3, block_size=block_size, shuffle_window=window):
        sampler.set_epoch(epoch)
        parts.append(list(sampler))
        assert len(parts[-1]) == len(sampler)
    assert sorted(index for part in parts for index in part) == list(range(size))
    assert max(map(len, parts)) - min(map(len, parts)) <= 1


@given(st.integers(1, 200), st.integers(1, 30), st.integers(1, 50), st.integers(1, 4), st.integers(1, 4),
       st.integers(1, 9), st.data())
def test_block_shuffle_resumes_at_any_world_size(size, block_size, window, world_size, new_world_size, batch_size,
                                                  data):
    options = {"seed": 9, "block_size": block_size, "shuffle_window": window}
    before = samplers(size, world_size, **options)
    for sampler in before:
        sampler.set_epoch(2)
    parts = [list(sampler) for sampler in before]
    steps = data.draw(st.integers(0, -(-len(parts[0]) // batch_size)))
    consumed = [index for part in parts for index in part[: steps * batch_size]]
    state = before[0].state_dict(steps * batch_size)
    resumed = []
    for rank, sampler in enumerate(samplers(size, new_world_size, **options)):
        sampler.load_state_dict(state)
        sampler.set_epoch(state["epoch"])
        rest = list(sampler)
        assert len(rest) == len(sampler)
        if new_world_size == world_size:
            assert rest == parts[rank][steps * batch_size :]
        resumed += rest
    assert sorted(consumed + resumed) == list(range(size))


def test_default_order_is_the_full_shuffle_it_was_before_blocks_existed():
    """Vectors saved from the sampler before the block shuffle was added: the default must not move."""
    sampler = ExactlyOnceSampler(1000, seed=11, rank=2, world_size=3)
    sampler.set_epoch(5)
    assert list(sampler)[:20] == [84, 948, 260, 701, 626, 998, 287, 517, 633, 209, 162, 643, 315, 493, 817, 934,
                                  256, 762, 987, 46]
    sampler = ExactlyOnceSampler(77, seed=4, rank=1, world_size=2)
    sampler.set_epoch(1)
    assert list(sampler) == [22, 28, 42, 13, 75, 19, 66, 59, 71, 27, 37, 7, 11, 68, 20, 12, 63, 39, 33, 31, 47, 3,
                             24, 51, 17, 50, 56, 21, 55, 57, 25, 23, 54, 15, 45, 62, 36, 14]


def test_a_state_saved_before_the_block_options_existed_still_resumes_the_full_shuffle():
    old_state = {"kind": "ExactlyOnceSampler", "size": 50, "shuffle": True, "seed": 1, "epoch": 0,
                 "samples_consumed": 10}
    sampler = ExactlyOnceSampler(50, seed=1, rank=0, world_size=1)
    sampler.load_state_dict(old_state)
    assert len(sampler) == 40


@given(st.integers(1, 500), st.integers(0, 2**64 - 1), st.lists(st.integers(0, 2**40), min_size=1, max_size=20))
def test_a_tweak_selects_the_permutation_of_the_key_derived_one_part_further(size, seed, tweaks):
    positions = np.arange(len(tweaks)) % size
    family = Permutation(size, derive_key(7, seed))
    expected = [int(Permutation(size, derive_key(7, seed, tweak))([position])[0])
                for position, tweak in zip(positions.tolist(), tweaks)]
    assert family(positions, tweaks=np.array(tweaks)).tolist() == expected


def distinct_blocks_per_batch(order: list[int], block_size: int, batch: int) -> list[int]:
    """For each whole batch of `batch` consecutive positions, how many blocks its records come from."""
    return [len({record // block_size for record in order[start : start + batch]})
            for start in range(0, len(order) - batch + 1, batch)]


@pytest.mark.parametrize("block_size, window", [(64, 64), (64, 256), (16, 256), (100, 30), (1000, 4000)])
def test_a_batch_of_the_block_shuffle_reads_few_blocks_where_the_full_shuffle_reads_one_per_record(block_size,
                                                                                                 window):
    """Any 64 consecutive positions hold records of at most ceil((64 + 2 window - 2) / block) + 2 blocks: they lie
    in at most two windows plus the whole windows between, a stretch of 64 + 2 (window - 1) positions of the
    block sequence, and such a stretch meets at most that many blocks (one of them may be the short one)."""
    size, batch = 100_003, 64
    bound = math.ceil((batch + 2 * window - 2) / block_size) + 2
    blocked = list(ExactlyOnceSampler(size, seed=1, block_size=block_size, shuffle_window=window, rank=0,
                                      world_size=1))
    full = list(ExactlyOnceSampler(size, seed=1, rank=0, world_size=1))
    assert max(distinct_blocks_per_batch(blocked, block_size, batch)) <= bound
    assert min(distinct_blocks_per_batch(full, block_size, batch)) > bound


def test_blocks_come_from_anywhere_and_records_within_a_window_are_mixed():
    size, block_size, window = 100_000, 50, 200
    order = np.array(list(ExactlyOnceSampler(size, seed=2, block_size=block_size, shuffle_window=window, rank=0,
                                             world_size=1)))
    first_blocks = order[::window] // block_size  # a block of each window, window after window
    assert abs(np.corrcoef(np.arange(len(first_blocks)), first_blocks)[0, 1]) < 0.1
    assert len(np.unique(first_blocks)) == len(first_blocks)
    ascending = np.mean(np.diff(order) == 1)  # a window left in order would step by 1 inside each block
    assert ascending < 0.05
    blocks_per_quarter_window = np.mean(distinct_blocks_per_batch(order.tolist(), block_size, window // 4))
    assert blocks_per_quarter_window > 3  # 50 positions drawn from 4 blocks: nearly all 4 appear


def test_block_shuffle_repeats_per_seed_and_epoch_and_changes_with_them():
    def order(seed: int, epoch: int) -> list[int]:
        sampler = ExactlyOnceSampler(500, seed=seed, block_size=16, shuffle_window=64, rank=0, world_size=1)
        sampler.set_epoch(epoch)
        return list(sampler)

    assert order(1, 0) == order(1, 0)
    assert order(1, 1) != order(1, 0) and order(2, 0) != order(1, 0)
    assert order(1, 0) != list(ExactlyOnceSampler(500, seed=1, rank=0, world_size=1))


def test_block_shuffle_of_a_huge_range_is_evaluated_without_materialising_it():
    sampler = ExactlyOnceSampler(10**13, seed=1, block_size=4096, shuffle_window=1 << 20, rank=3, world_size=8)
    first = [index for index, _ in zip(sampler, range(5))]
    assert len(set(first)) == 5 and all(0 <= index < 10**13 for index in first)
    assert len(sampler) == 10**13 // 8


def test_the_window_defaults_to_one_block():
    one_block = ExactlyOnceSampler(300, seed=1, block_size=32, rank=0, world_size=1)
    assert one_block.shuffle_window == 32
    assert list(one_block) == list(ExactlyOnceSampler(300, seed=1, block_size=32, shuffle_window=32, rank=0,
                                                      world_size=1))


def test_resuming_with_other_block_options_is_refused():
    state = ExactlyOnceSampler(100, seed=1, block_size=10, shuffle_window=20, rank=0, world_size=1).state_dict(5)
    assert (state["block_size"], state["shuffle_window"]) == (10, 20)
    with pytest.raises(varstore.VarstoreError, match="block_size: saved 10, now None"):
        ExactlyOnceSampler(100, seed=1, rank=0, world_size=1).load_state_dict(state)
    with pytest.raises(varstore.VarstoreError, match="shuffle_window: saved 20, now 40"):
        ExactlyOnceSampler(100, seed=1, block_size=10, shuffle_window=40, rank=0, world_size=1).load_state_dict(state)
    full = ExactlyOnceSampler(100, seed=1, rank=0, world_size=1).state_dict(5)
    with pytest.raises(varstore.VarstoreError, match="block_size: saved None, now 10"):
        ExactlyOnceSampler(100, seed=1, block_size=10, rank=0, world_size=1).load_state_dict(full)


@pytest.mark.parametrize("options, message", [
    ({"block_size": 0}, "block_size must be at least 1, not 0"),
    ({"block_size": -4}, "block_size must be at least 1, not -4"),
    ({"block_size": 2.5}, "block_size must be an integer"),
    ({"block_size": True}, "block_size must be an integer"),
    ({"block_size": 8, "shuffle_window": 0}, "shuffle_window must be at least 1, not 0"),
    ({"block_size": 8, "shuffle_window": "64"}, "shuffle_window must be an integer"),
    ({"shuffle_window": 64}, "shuffle_window=64 needs a block_size"),
    ({"block_size": 8, "shuffle": False}, "block_size=8 shapes a shuffle: it needs shuffle=True"),
])
def test_block_options_are_checked(options, message):
    with pytest.raises(varstore.VarstoreError, match=message):
        ExactlyOnceSampler(100, rank=0, world_size=1, **options)


@pytest.mark.parametrize("world_size", [1, 3])
def test_every_record_once_across_the_chunks_the_sampler_computes_at_a_time(world_size):
    """The sampler evaluates its order 8,192 positions at a time: windows and blocks cut by a chunk stay whole."""
    size = 3 * 8192 * world_size + 101
    parts = [list(sampler) for sampler in samplers(size, world_size, seed=1, block_size=100, shuffle_window=300)]
    assert sorted(index for part in parts for index in part) == list(range(size))
    key = derive_key(5, 1, 0)  # the sampler's block shuffle key: (its purpose number, seed, epoch)
    assert parts[0][:20] == reference_block_shuffle(size, 100, 300, key)[: 20 * world_size : world_size]

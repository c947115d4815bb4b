"""Keyed permutations and ExactlyOnceSampler: bijections, exact rank partitions, resumption at any world size."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import varstore
from varstore.torch import ExactlyOnceSampler
from varstore.torch.permutation import Permutation, derive_key


@given(st.integers(0, 3000), st.integers(0, 2**64 - 1))
def test_permutation_is_a_bijection_and_inverse_undoes_it(size, key):
    permutation = Permutation(size, key)
    values = permutation(np.arange(size))
    assert np.array_equal(np.sort(values), np.arange(size))
    assert np.array_equal(permutation.inverse(values), np.arange(size))


def test_permutation_of_a_huge_range_is_evaluated_without_materialising_it():
    size = 10**15
    positions = np.array([0, 1, size // 2, size - 1])
    values = Permutation(size, derive_key(0, 1))(positions)
    assert ((values >= 0) & (values < size)).all() and len(set(values.tolist())) == 4
    assert np.array_equal(Permutation(size, derive_key(0, 1)).inverse(values), positions)


def test_permutation_looks_unrelated_to_the_identity():
    """Rank correlation with the identity stays near 0 over many keys; a weak shuffle would drift from it."""
    size = 1000
    correlations = [np.corrcoef(np.arange(size), Permutation(size, derive_key(7, epoch))(np.arange(size)))[0, 1]
                    for epoch in range(50)]
    assert abs(np.mean(correlations)) < 0.02 and max(map(abs, correlations)) < 0.15


def test_positions_outside_the_range_are_refused():
    with pytest.raises(ValueError, match=r"\[0, 5\)"):
        Permutation(5, 0)([5])


@given(st.integers(0, 200), st.integers(1, 7), st.booleans())
def test_ranks_together_see_every_index_once_with_sizes_differing_by_at_most_one(size, world_size, shuffle):
    samplers = [ExactlyOnceSampler(size, shuffle=shuffle, seed=5, rank=rank, world_size=world_size)
                for rank in range(world_size)]
    parts = [list(sampler) for sampler in samplers]
    assert sorted(index for part in parts for index in part) == list(range(size))
    assert [len(part) for part in parts] == [len(sampler) for sampler in samplers]
    assert max(map(len, parts)) - min(map(len, parts)) <= 1


def test_epochs_and_seeds_change_the_order_and_repeat_it_exactly():
    sampler = ExactlyOnceSampler(100, seed=1, rank=0, world_size=1)
    first = list(sampler)
    assert first == list(sampler)
    sampler.set_epoch(1)
    assert list(sampler) != first
    assert list(ExactlyOnceSampler(100, seed=2, rank=0, world_size=1)) != first


@given(st.integers(1, 120), st.integers(1, 4), st.integers(1, 4), st.integers(1, 9), st.data())
def test_resume_continues_the_epoch_at_any_world_size(size, world_size, new_world_size, batch_size, data):
    """Ranks stepping together consume the first steps * batch_size * world_size positions of the epoch order."""
    samplers = [ExactlyOnceSampler(size, seed=9, rank=rank, world_size=world_size) for rank in range(world_size)]
    for sampler in samplers:
        sampler.set_epoch(4)
    parts = [list(sampler) for sampler in samplers]
    steps = data.draw(st.integers(0, -(-len(parts[0]) // batch_size)))
    consumed = [part[: steps * batch_size] for part in parts]
    states = [sampler.state_dict(steps * batch_size) for sampler in samplers]
    assert all(state == states[0] for state in states)
    resumed = []
    for rank in range(new_world_size):
        sampler = ExactlyOnceSampler(size, seed=9, rank=rank, world_size=new_world_size)
        sampler.load_state_dict(states[0])
        sampler.set_epoch(4)
        assert len(sampler) == len(list(sampler))
        if new_world_size == world_size:
            assert list(sampler) == parts[rank][steps * batch_size :]
        resumed += list(sampler)
    assert sorted(resumed + [index for part in consumed for index in part]) == list(range(size))


def test_epoch_order_is_pinned_so_saved_resume_states_stay_valid_across_releases():
    """A resume state holds only a count into the epoch order: if the order (the permutation, its key, the
    default seed or first epoch) changed between releases, a resumed run would repeat and skip samples."""
    assert list(ExactlyOnceSampler(20, rank=0, world_size=1)) == [
        11, 15, 2, 3, 14, 12, 17, 9, 0, 13, 4, 10, 8, 7, 19, 1, 6, 16, 5, 18]
    sampler = ExactlyOnceSampler(20, seed=3, rank=1, world_size=2)
    sampler.set_epoch(2)
    assert list(sampler) == [0, 1, 14, 16, 5, 6, 4, 19, 11, 18]


def test_resume_state_from_other_settings_is_refused():
    state = ExactlyOnceSampler(50, seed=1, rank=0, world_size=1).state_dict(10)
    with pytest.raises(varstore.VarstoreError, match="seed: saved 1, now 2"):
        ExactlyOnceSampler(50, seed=2, rank=0, world_size=1).load_state_dict(state)
    with pytest.raises(varstore.VarstoreError, match="size: saved 50, now 51"):
        ExactlyOnceSampler(51, seed=1, rank=0, world_size=1).load_state_dict(state)
    with pytest.raises(varstore.VarstoreError, match="samples_consumed"):
        ExactlyOnceSampler(50, seed=1, rank=0, world_size=1).load_state_dict({**state, "samples_consumed": 51})
    with pytest.raises(varstore.VarstoreError, match="samples_consumed is -1"):
        ExactlyOnceSampler(50, seed=1, rank=0, world_size=1).state_dict(-1)


def test_a_launcher_world_without_a_process_group_is_refused(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "4")
    with pytest.raises(varstore.VarstoreError, match="WORLD_SIZE is 4"):
        ExactlyOnceSampler(10)
    assert len(ExactlyOnceSampler(10, rank=3, world_size=4)) == 2
    with pytest.raises(varstore.VarstoreError, match="rank 4"):
        ExactlyOnceSampler(10, rank=4, world_size=4)

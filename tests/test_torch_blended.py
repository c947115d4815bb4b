"""BlendedDataset: proportions within the stated bound, every record once per source epoch, schedules that carry
positions across a switch, determinism, and O(1) construction at 10**12 samples."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
import tracemalloc
from fractions import Fraction
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from varstore import VarstoreError
from varstore.errors import RecordIndexError
from varstore.torch import BlendedDataset


class Numbers:
    """A map-style dataset whose sample i is i, counting the batched reads it serves."""

    def __init__(self, length: int) -> None:
        self.length = length
        self.batched_reads = 0

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> int:
        assert 0 <= index < self.length
        return index

    def __getitems__(self, indices: list[int]) -> list[int]:
        self.batched_reads += 1
        return [self[index] for index in indices]


NAMES = "abcdef"
weight_values = st.one_of(st.integers(0, 9), st.floats(0.0, 5.0, allow_nan=False), st.fractions(0, 3, max_denominator=50))
weights_strategy = st.lists(weight_values, min_size=1, max_size=6).map(lambda ws: dict(zip(NAMES, ws))).filter(
    lambda ws: sum(Fraction(w) for w in ws.values()) > 0
)
lengths_strategy = st.lists(st.integers(1, 9), min_size=6, max_size=6)


def numbers(lengths: list[int], names: str = NAMES) -> dict[str, Numbers]:
    return {name: Numbers(length) for name, length in zip(names, lengths)}


def walk(blend: BlendedDataset, count: int) -> list[tuple[str, int]]:
    """(source, record) of the first `count` samples, batched (`locate` one by one builds a permutation each time)."""
    return [(blend.names[source], record) for source, record in blend._records(range(count))]


def stated_bound(weights: dict) -> Fraction:
    """ceil(log2 s) / 2 for s sources of positive weight, computed here from the weights alone."""
    positive = sum(1 for weight in weights.values() if Fraction(weight) > 0)
    return Fraction(math.ceil(math.log2(positive)), 2) if positive > 1 else Fraction(0)


@given(weights_strategy, st.integers(1, 300))
def test_every_prefix_keeps_each_source_within_the_stated_bound_of_weight_times_prefix(weights, count):
    blend = BlendedDataset(numbers([5] * 6), weights, num_samples=count)
    total = sum(Fraction(weight) for weight in weights.values())
    bound = stated_bound(weights)
    assert blend.proportion_bound == bound
    taken = dict.fromkeys(weights, 0)
    for prefix, (name, _) in enumerate(walk(blend, count), start=1):
        taken[name] += 1
        for source, weight in weights.items():
            assert abs(taken[source] - Fraction(weight) / total * prefix) <= bound, (source, prefix, taken)


@given(weights_strategy, st.integers(0, 10**12 - 2))
def test_far_prefixes_keep_the_bound_and_grow_by_the_located_source(weights, prefix):
    blend = BlendedDataset(numbers([7] * 6), weights, num_samples=10**12)
    total = sum(Fraction(weight) for weight in weights.values())
    before, after = blend.describe(prefix), blend.describe(prefix + 1)
    for source, weight in weights.items():
        assert abs(before[source].samples - Fraction(weight) / total * prefix) <= stated_bound(weights)
    grown = [name for name in weights if after[name].samples != before[name].samples]
    assert grown == [blend.locate(prefix)[0]]
    assert after[grown[0]].samples == before[grown[0]].samples + 1


@given(weights_strategy, lengths_strategy, st.integers(1, 200))
def test_describe_counts_what_walking_the_blend_takes_and_each_sources_epoch(weights, lengths, count):
    blend = BlendedDataset(numbers(lengths), weights, num_samples=count)
    taken = dict.fromkeys(NAMES[: len(lengths)], 0)
    assert {name: progress.samples for name, progress in blend.describe(0).items()} == taken
    for prefix, (name, _) in enumerate(walk(blend, count), start=1):
        taken[name] += 1
        progress = blend.describe(prefix)
        for source, length in zip(NAMES, lengths):
            assert progress[source].samples == taken[source]
            assert (progress[source].epoch, progress[source].position) == divmod(taken[source], length)


def assert_each_epoch_uses_every_record_once(blend: BlendedDataset, count: int) -> None:
    """Each source's records, in the order the blend uses them, cut into epochs of its length: each a permutation."""
    used: dict[str, list[int]] = {}
    for name, record in walk(blend, count):
        used.setdefault(name, []).append(record)
    for name, records in used.items():
        length = len(blend.sources[blend.names.index(name)])
        for start in range(0, len(records), length):
            epoch = records[start : start + length]
            assert len(set(epoch)) == len(epoch), (name, start // length, epoch)
            assert set(epoch) <= set(range(length))


@given(weights_strategy, lengths_strategy, st.integers(1, 200), st.integers(0, 3))
def test_no_record_of_a_source_repeats_before_its_epoch_is_used_up(weights, lengths, count, seed):
    assert_each_epoch_uses_every_record_once(BlendedDataset(numbers(lengths), weights, num_samples=count, seed=seed), count)


def test_a_small_source_walks_a_fresh_order_each_epoch():
    blend = BlendedDataset({"small": Numbers(50), "large": Numbers(10**9)}, {"small": 1, "large": 1}, num_samples=400)
    small = [record for name, record in walk(blend, 400) if name == "small"]
    epochs = [small[start : start + 50] for start in range(0, 200, 50)]
    assert all(sorted(epoch) == list(range(50)) for epoch in epochs)
    assert len({tuple(epoch) for epoch in epochs}) == 4


schedules = st.lists(st.tuples(st.integers(1, 60), weights_strategy), min_size=1, max_size=4).map(
    lambda steps: [(sum(gap for gap, _ in steps[:k]), weights) for k, (_, weights) in enumerate(steps)]
).map(lambda schedule: [(0, schedule[0][1])] + schedule[1:])


@settings(max_examples=30)
@given(schedules, lengths_strategy, st.integers(0, 80))
def test_schedule_switches_neither_repeat_nor_skip_a_record_of_any_source(schedule, lengths, extra):
    count = schedule[-1][0] + 1 + extra
    blend = BlendedDataset(numbers(lengths), schedule, num_samples=count)
    assert_each_epoch_uses_every_record_once(blend, count)
    walked = walk(blend, count)
    for start, _ in schedule[1:]:
        # The segment after a switch continues every source's count from the prefix before it.
        taken = [name for name, _ in walked[:start]]
        assert {name: progress.samples for name, progress in blend.describe(start).items()} == {name: taken.count(name) for name in NAMES}


@settings(max_examples=30)
@given(schedules, lengths_strategy, st.integers(1, 60), weights_strategy)
def test_resuming_with_a_new_schedule_that_keeps_the_consumed_segments_reproduces_the_consumed_prefix(
    schedule, lengths, after_last_start, new_weights
):
    consumed = schedule[-1][0] + after_last_start
    old = BlendedDataset(numbers(lengths), schedule, num_samples=consumed + 50)
    new_schedule = list(schedule) + [(consumed, new_weights)]
    new = BlendedDataset(numbers(lengths), new_schedule, num_samples=consumed + 50)
    assert walk(new, consumed) == walk(old, consumed)


def test_adding_a_source_at_a_checkpoint_keeps_the_prefix_and_continues_the_old_sources():
    old = BlendedDataset({"web": Numbers(30), "code": Numbers(20)}, {"web": 3, "code": 1}, num_samples=200)
    new = BlendedDataset(
        {"web": Numbers(30), "code": Numbers(20), "math": Numbers(7)},
        [(0, {"web": 3, "code": 1}), (120, {"web": 1, "code": 1, "math": 2})],
        num_samples=200,
    )
    assert walk(new, 120) == walk(old, 120)
    web_before = [record for name, record in walk(old, 120) if name == "web"]
    web_after = [record for name, record in walk(new, 200) if name == "web"]
    assert web_after[: len(web_before)] == web_before
    assert_each_epoch_uses_every_record_once(new, 200)
    math_records = [record for name, record in walk(new, 200)[120:] if name == "math"]
    assert len(math_records) >= 7 and sorted(math_records[:7]) == list(range(7))


def test_segment_weights_equal_after_normalising_give_the_same_blend():
    plain = BlendedDataset(numbers([4, 9]), [(0, {"a": 1, "b": 3}), (40, {"a": 1})], num_samples=90)
    scaled = BlendedDataset(numbers([4, 9, 5]), [(0, {"a": 0.5, "b": 1.5, "c": 0}), (40, {"a": 7, "b": 0})], num_samples=90)
    assert walk(plain, 90) == walk(scaled, 90)


def test_the_order_of_the_sources_dict_does_not_change_the_blend_but_the_seed_does():
    sources = {"a": Numbers(50), "b": Numbers(60), "c": Numbers(70)}
    weights = {"a": 1, "b": 2, "c": 3}
    forward = BlendedDataset(sources, weights, num_samples=100, seed=5)
    backward = BlendedDataset(dict(reversed(sources.items())), dict(reversed(weights.items())), num_samples=100, seed=5)
    other_seed = BlendedDataset(sources, weights, num_samples=100, seed=6)
    assert walk(forward, 100) == walk(backward, 100)
    assert walk(other_seed, 100) != walk(forward, 100)
    assert [name for name, _ in walk(other_seed, 100)] == [name for name, _ in walk(forward, 100)]


BLEND_IN_A_CHILD = """
import json, sys
from tests.test_torch_blended import Numbers
from varstore.torch import BlendedDataset
blend = BlendedDataset({"a": Numbers(1000), "b": Numbers(10**9)}, [(0, {"a": 0.3, "b": 0.7}), (10**11, {"b": 1})],
                       num_samples=10**12, seed=11)
samples = [0, 1, 2, 99, 10**11 - 1, 10**11, 10**12 - 1]
print(json.dumps([blend.locate(sample) for sample in samples]))
"""


def test_another_process_computes_the_same_samples():
    blend = BlendedDataset({"a": Numbers(1000), "b": Numbers(10**9)}, [(0, {"a": 0.3, "b": 0.7}), (10**11, {"b": 1})],
                           num_samples=10**12, seed=11)
    samples = [0, 1, 2, 99, 10**11 - 1, 10**11, 10**12 - 1]
    child = subprocess.run(
        [sys.executable, "-c", BLEND_IN_A_CHILD], capture_output=True, text=True, timeout=60, check=True,
        env={"PYTHONHASHSEED": "123", "PATH": ""}, cwd=Path(__file__).parents[1],
    )
    assert [tuple(pair) for pair in json.loads(child.stdout)] == [blend.locate(s) for s in samples]


def test_a_blend_of_10_to_the_12_samples_is_built_in_well_under_a_megabyte():
    sources = {name: Numbers(10**9 + index) for index, name in enumerate("abcdefgh")}
    schedule = [(step * 10**11, {name: step + index + 1 for index, name in enumerate("abcdefgh")}) for step in range(10)]
    tracemalloc.start()
    try:
        blend = BlendedDataset(sources, schedule, num_samples=10**12)
        blend.__getitems__(list(range(10**12 - 1000, 10**12)))
        blend.describe(10**12)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20
    assert sum(progress.samples for progress in blend.describe(10**12).values()) == 10**12


def test_getitems_reads_each_source_once_per_batch_and_returns_the_samples_in_order():
    sources = {"a": Numbers(10), "b": Numbers(10), "c": Numbers(10)}
    blend = BlendedDataset(sources, {"a": 1, "b": 1, "c": 2}, num_samples=100)
    order = [57, 3, 99, 3, 41, 0, 12, 80, 81, 82, 83]
    batch = blend.__getitems__(order)
    touched = {blend.locate(sample)[0] for sample in order}
    assert {name: source.batched_reads for name, source in sources.items()} == {name: int(name in touched) for name in sources}
    assert batch == [blend.locate(sample)[1] for sample in order] == [blend[sample] for sample in order]


def test_a_source_without_getitems_is_read_one_sample_at_a_time():
    blend = BlendedDataset({"list": list(range(100, 110)), "tuple": tuple(range(7))}, {"list": 1, "tuple": 1}, num_samples=30)
    located = walk(blend, 30)
    assert blend.__getitems__(list(range(30))) == [
        (100 + record if name == "list" else record) for name, record in located
    ]


@pytest.mark.parametrize(
    ("weights", "num_samples", "names"),
    [
        ({"a": 1, "z": 1}, 10, "unknown sources ['z']"),
        ({"a": -1, "b": 2}, 10, "must be >= 0"),
        ({"a": float("nan")}, 10, "must be finite"),
        ({"a": "1"}, 10, "must be a number"),
        ({"a": 0, "b": 0}, 10, "no source a positive weight"),
        ({"empty": 1}, 10, "no records"),
        ([(5, {"a": 1})], 10, "must start at sample 0"),
        ([(0, {"a": 1}), (0, {"b": 1})], 10, "increasing"),
        ([(0, {"a": 1}), (10, {"b": 1})], 10, "only 10 samples"),
        ([], 10, "non-empty list"),
        ([(0, 1)], 10, "(start_sample, {name: weight}) pair"),
        ({"a": 1}, 0, "num_samples must be at least 1"),
    ],
)
def test_bad_weights_or_schedules_are_refused_naming_what_was_expected(weights, num_samples, names):
    with pytest.raises(VarstoreError, match=re.escape(names)):
        BlendedDataset({"a": Numbers(3), "b": Numbers(3), "empty": Numbers(0)}, weights, num_samples=num_samples)


def test_samples_outside_the_blend_and_non_integers_are_refused():
    blend = BlendedDataset({"a": Numbers(3)}, {"a": 1}, num_samples=10)
    with pytest.raises(RecordIndexError, match="sample 10 is out of range"):
        blend[10]
    with pytest.raises(VarstoreError, match="integers, not float"):
        blend[1.0]
    with pytest.raises(VarstoreError, match=r"in \[0, 10\]"):
        blend.describe(11)
    with pytest.raises(VarstoreError, match="path or a map-style dataset"):
        BlendedDataset({"a": 3}, {"a": 1}, num_samples=10)

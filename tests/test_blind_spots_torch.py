"""The torch layer's refusals no other test pinned: the mutants of issue 23 that passed its tests."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("torch")

import varstore
from varstore.torch import BlendedDataset, RecordStream
from varstore.torch import stream as stream_module
from varstore.torch.prefetch import Prefetcher


class Unconvertible(Decimal):
    """A Decimal that fails the test if anything converts it to a fraction: the refusal must come first."""

    def as_integer_ratio(self) -> tuple[int, int]:
        raise AssertionError(f"{self!r} was converted to an exact fraction before its size was judged")


@pytest.mark.parametrize("spelling", ["3" * 4970 + ".3", "9" * 4970 + ".9"])
def test_a_decimal_weight_of_4971_digits_with_a_fraction_part_is_refused_before_it_is_converted(spelling: str) -> None:
    """A Decimal's numerator may reach 10**4970 (16,512 bits): 4,971 digits are over it whatever the exponent."""
    with pytest.raises(varstore.VarstoreError, match=r"the weight of source 'a' \(segment at 0\) is .*round it"):
        BlendedDataset({"a": [1, 2], "b": [3]}, {"a": Unconvertible(spelling), "b": 1}, num_samples=4)


def test_a_worker_state_of_a_negative_batch_count_is_refused_in_its_own_worker(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with varstore.ShardedWriter(tmp_path / "data", max_shard_records=8) as writer:
        writer.extend([bytes([index]) * (index + 1) for index in range(40)])
    stream = RecordStream(tmp_path / "data", batch_size=4, seed=1, rank=0, world_size=1)
    state = {**stream.state_dict(), "worker": 0, "workers": 2, "worker_batches": -1, "batch_size": 4}
    monkeypatch.setattr(stream_module, "get_worker_info", lambda: SimpleNamespace(id=0, num_workers=2))
    with pytest.raises(varstore.VarstoreError, match="saved worker_batches is -1; it cannot be negative"):
        RecordStream(tmp_path / "data", batch_size=4, seed=1, rank=0, world_size=1).load_state_dict(state)
    RecordStream(tmp_path / "data", batch_size=4, seed=1, rank=0, world_size=1).load_state_dict(
        {**state, "worker_batches": 0})  # a worker that had yielded nothing yet


def test_a_prefetcher_hands_over_each_result_in_order_up_to_the_last_job() -> None:
    prefetcher = Prefetcher([lambda number=number: f"job {number}" for number in range(3)], ahead=1)
    try:
        for count in (1, 2, 3):  # the last wait finds exactly the jobs asked for done: none is left to run
            prefetcher.wait(count)
            assert prefetcher.take(count - 1) == f"job {count - 1}"
    finally:
        prefetcher.close()


def test_a_failed_prefetch_job_raises_its_own_error_when_it_or_a_later_job_is_waited_for() -> None:
    failure = OSError("planted download failure")

    def fail() -> None:
        raise failure

    prefetcher = Prefetcher([lambda: "first", fail, lambda: "never run"], ahead=1)
    try:
        prefetcher.wait(1)
        assert prefetcher.take(0) == "first"
        with pytest.raises(OSError) as raised:
            prefetcher.wait(3)
        assert raised.value is failure
    finally:
        prefetcher.close()

"""GrainSource read by Grain's own DataLoader and IndexSampler: every record once per epoch, a checkpoint resumed
mid-epoch with the records it had left, and a checkpoint refused on a rewritten dataset (Grain compares the reprs)."""

from __future__ import annotations

import pytest

grain = pytest.importorskip("grain.python")

from varstore.grain import GrainSource

from .helpers_torch import write_indexed_dataset

RECORDS = 61


def _loader(path, worker_count: int) -> grain.DataLoader:
    source = GrainSource(path)
    sampler = grain.IndexSampler(len(source), shuffle=True, num_epochs=1, seed=4)
    return grain.DataLoader(data_source=source, sampler=sampler, worker_count=worker_count)


def _index(record) -> int:
    assert record.tolist() == [int(record[0])] * (1 + int(record[0]) % 5)
    return int(record[0])


@pytest.mark.parametrize("worker_count", [0, 2])
def test_grain_resumes_a_checkpoint_with_the_records_it_had_left(tmp_path, worker_count):
    write_indexed_dataset(tmp_path / "data", RECORDS, max_shard_records=20)
    whole = [_index(record) for record in _loader(tmp_path / "data", worker_count)]
    assert sorted(whole) == list(range(RECORDS))
    records = iter(_loader(tmp_path / "data", worker_count))
    taken = [_index(next(records)) for _ in range(17)]
    state = records.get_state()
    resumed = iter(_loader(tmp_path / "data", worker_count))
    resumed.set_state(state)
    assert taken + [_index(record) for record in resumed] == whole


def test_grain_refuses_a_checkpoint_of_a_rewritten_dataset(tmp_path):
    write_indexed_dataset(tmp_path / "data", RECORDS, max_shard_records=20)
    records = iter(_loader(tmp_path / "data", 0))
    next(records)
    state = records.get_state()
    write_indexed_dataset(tmp_path / "new", RECORDS, max_shard_records=10)  # the same records, in other shards
    (tmp_path / "data").rename(tmp_path / "old")
    (tmp_path / "new").rename(tmp_path / "data")
    with pytest.raises(ValueError, match="data source"):
        iter(_loader(tmp_path / "data", 0)).set_state(state)


def test_the_repr_names_path_count_and_version(tmp_path):
    write_indexed_dataset(tmp_path / "data", RECORDS, max_shard_records=20)
    source = GrainSource(tmp_path / "data")
    assert repr(source).startswith(f"GrainSource(path={str(tmp_path / 'data')!r}, records={RECORDS}, version=")
    assert len(source) == RECORDS and _index(source[RECORDS - 1]) == RECORDS - 1

"""Round 3 attacks on resume states: forged integers, wrong types and kinds, another dataset's version, a state from
before versions were saved, malformed torchdata StatefulDataLoader states, and RecordStream stages no run could
have saved (absurd world sizes, more stages than records, a stage past its share). Tests of real bugs are strict
xfails naming what should happen."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")

import varstore
from varstore.errors import VarstoreError
from varstore.torch import BlendedDataset, ExactlyOnceSampler, RecordStream
from varstore.torch import stream as stream_module

RECORDS = 20
PART_CALLS_ALLOWED = 100_000  # far more than any state of a 20-record dataset needs; a hang is far more


@pytest.fixture
def dataset(tmp_path):
    """A 20-record shard whose record i is [i]."""
    path = str(tmp_path / "records")
    with varstore.Writer(path, "ndarray", dtype="int64") as writer:
        for i in range(RECORDS):
            writer.append(np.array([i]))
    return path


def new_stream(path: str) -> RecordStream:
    return RecordStream(path, batch_size=2, block_size=4, shuffle_window=8, rank=0, world_size=1, output="numpy")


def records_read(stream: RecordStream) -> list[int]:
    return sorted(int(record) for batch in stream for record in np.asarray(batch).ravel())


@pytest.fixture
def bounded_part(monkeypatch):
    """Makes `_part` (called once per rank of a stage) raise past `PART_CALLS_ALLOWED` calls: a state whose loading
    loops over 10**12 ranks fails fast instead of hanging the suite."""
    calls = [0]
    real_part = stream_module._part

    def counted(length: int, world_size: int, rank: int) -> tuple[int, int]:
        calls[0] += 1
        if calls[0] > PART_CALLS_ALLOWED:
            raise RuntimeError(f"_part called more than {PART_CALLS_ALLOWED} times: unbounded work from a forged state")
        return real_part(length, world_size, rank)

    monkeypatch.setattr(stream_module, "_part", counted)


@pytest.mark.parametrize(("key", "value", "message"), [
    ("samples_consumed", -1, r"must be in \[0, 20\]"),
    ("samples_consumed", 10**40, r"must be in \[0, 20\]"),
    ("samples_consumed", 2.0, "must be an integer"),
    ("samples_consumed", True, "must be an integer"),
    ("epoch", "1", "must be an integer"),
    ("size", 21, "other settings"),
    ("seed", 2, "other settings"),
    ("kind", "RecordStream", "of kind 'RecordStream'"),
    ("dataset_version", "ffff", "dataset version ffff"),
])
def test_a_forged_sampler_state_is_refused_with_the_field_named(dataset, key, value, message):
    saved = ExactlyOnceSampler(varstore.open(dataset), seed=1, rank=0, world_size=1).state_dict(3)
    sampler = ExactlyOnceSampler(varstore.open(dataset), seed=1, rank=0, world_size=1)
    with pytest.raises(VarstoreError, match=message):
        sampler.load_state_dict({**saved, key: value})


def test_a_state_from_before_versions_loads_on_matching_settings_and_is_refused_on_others(dataset):
    saved = ExactlyOnceSampler(RECORDS, seed=1, rank=0, world_size=1).state_dict(3)
    saved.pop("dataset_version")  # a 1.x state
    resumed = ExactlyOnceSampler(varstore.open(dataset), seed=1, rank=0, world_size=1)
    resumed.load_state_dict(saved)
    whole_epoch = list(ExactlyOnceSampler(RECORDS, seed=1, rank=0, world_size=1))
    assert list(resumed) == whole_epoch[3:]
    with pytest.raises(VarstoreError, match="other settings"):
        ExactlyOnceSampler(RECORDS + 1, seed=1, rank=0, world_size=1).load_state_dict(saved)


@pytest.mark.parametrize("forged", [
    {"_snapshot": 5},
    {"_snapshot": {}},
    {"_snapshot": {"_main_snapshot": 3}},
    {"_snapshot": {"_worker_snapshots": {"workers": {}}, "_main_snapshot": {}}},
], ids=["snapshot-not-a-dict", "snapshot-empty", "main-snapshot-not-a-dict", "worker-key-without-number"])
def test_a_malformed_loader_state_is_a_varstore_error(dataset, forged):
    with pytest.raises(VarstoreError):
        ExactlyOnceSampler(RECORDS, rank=0, world_size=1).load_state_dict(forged)
    with pytest.raises(VarstoreError):
        new_stream(dataset).load_state_dict(forged)


def test_a_stream_state_of_another_dataset_version_is_refused(dataset, tmp_path):
    other = str(tmp_path / "other")
    with varstore.Writer(other, "ndarray", dtype="int64") as writer:
        for i in range(RECORDS):
            writer.append(np.array([i + 1]))
    saved = new_stream(other).state_dict(4)
    with pytest.raises(VarstoreError, match="dataset version"):
        new_stream(dataset).load_state_dict(saved)


def test_a_worker_state_loaded_in_the_main_process_is_refused(dataset):
    saved = {**new_stream(dataset).state_dict(0), "worker": 1, "workers": 2, "worker_batches": 3, "batch_size": 2}
    with pytest.raises(VarstoreError, match="resumes that worker only"):
        new_stream(dataset).load_state_dict(saved)


@pytest.mark.parametrize(("key", "value", "message"), [
    ("world_size", 0, "at least 1"),
    ("world_size", 10**12, "at most"),
    ("earlier_stages", "x", "must be a list"),
    ("earlier_stages", [[1]], r"must be \[world_size, samples_consumed\]"),
    ("earlier_stages", [[0, 1]], "at least 1"),
    ("earlier_stages", [[1, -3]], "at least 1"),
    ("earlier_stages", [[1.5, 1]], "must be an integer"),
    ("worker_batches", -1, "cannot be negative"),
])
def test_a_forged_stream_state_is_refused(dataset, bounded_part, key, value, message):
    saved = {**new_stream(dataset).state_dict(4), "worker": 0, "workers": 1, "batch_size": 2} \
        if key == "worker_batches" else new_stream(dataset).state_dict(4)
    with pytest.raises(VarstoreError, match=message):
        new_stream(dataset).load_state_dict({**saved, key: value})


@pytest.mark.parametrize("forged", [{"world_size": 10**12, "samples_consumed": 1},
                                    {"earlier_stages": [[10**12, 1]], "samples_consumed": 0}],
                         ids=["world-size", "earlier-stage"])
def test_a_state_of_an_absurd_world_size_loads_or_is_refused_with_bounded_work(dataset, bounded_part, forged):
    stream = new_stream(dataset)
    try:
        stream.load_state_dict({**stream.state_dict(0), **forged})
    except VarstoreError:
        return
    assert len(records_read(stream)) <= RECORDS


@pytest.mark.parametrize("stages", [[[1, 10**18]], [[1, 1]] * 100], ids=["past-its-share", "more-stages-than-records"])
def test_an_earlier_stage_no_run_could_save_is_refused(dataset, stages):
    stream = new_stream(dataset)
    saved = {**stream.state_dict(0), "earlier_stages": stages, "samples_consumed": 0}
    with pytest.raises(VarstoreError):
        stream.load_state_dict(saved)


def test_a_blend_state_of_another_blend_is_refused_and_one_without_a_version_loads(dataset, tmp_path):
    blend = BlendedDataset.from_data_path(dataset, num_samples=10)
    other = BlendedDataset.from_data_path(dataset, num_samples=11)
    with pytest.raises(VarstoreError, match="dataset version"):
        blend.load_state_dict(other.state_dict())
    with pytest.raises(VarstoreError, match="of kind 'ExactlyOnceSampler'"):
        blend.load_state_dict(ExactlyOnceSampler(RECORDS, rank=0, world_size=1).state_dict(0))
    blend.load_state_dict({"kind": "BlendedDataset"})  # saved before versions: nothing to check it against


def loader_state(path: str, worker_batches: list[int]) -> dict:
    """A torchdata StatefulDataLoader state of `new_stream(path)` under len(worker_batches) workers (the layout
    torchdata 0.11 saves), worker k having yielded worker_batches[k] batches of 2."""
    base = new_stream(path).state_dict(0)
    workers = {
        f"worker_{k}": {"worker_id": k, "dataset_state": {**base, "worker": k, "workers": len(worker_batches),
                                                          "worker_batches": batches, "batch_size": 2}}
        for k, batches in enumerate(worker_batches)
    }
    return {"_snapshot": {"_worker_snapshots": workers, "_main_snapshot": {}}, "_steps_since_snapshot": 0}


def test_a_loader_state_resumes_after_the_batches_its_workers_yielded(dataset):
    stream = new_stream(dataset)
    stream.load_state_dict(loader_state(dataset, [1, 1]))
    read = records_read(stream)
    assert len(read) == RECORDS - 2 * 2 and len(set(read)) == len(read)


@pytest.mark.parametrize("worker_batches", [[-1, 1], [10**30, 1]], ids=["negative", "absurd"])
def test_a_loader_state_with_a_forged_worker_count_is_refused(dataset, worker_batches):
    with pytest.raises(VarstoreError):
        new_stream(dataset).load_state_dict(loader_state(dataset, worker_batches))

"""Round 3 attacks on `varstore.grain.GrainSource`: keys Grain never gives, and a source pickled to a worker (or
kept open) after its dataset was rewritten, which must be refused rather than read with indices of other records."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

import varstore
from varstore.errors import DatasetReplacedError, RecordIndexError, RecordTypeError
from varstore.grain import GrainSource


@pytest.fixture
def dataset(tmp_path):
    path = tmp_path / "records"
    with varstore.ShardedWriter(path) as writer:
        writer.extend([b"first", b"second", b"third"])
    return path


@pytest.mark.parametrize(("key", "error"), [(-1, RecordIndexError), (3, RecordIndexError), (2**70, RecordIndexError),
                                            (np.uint64(2**63), RecordIndexError), (1.5, RecordTypeError),
                                            (True, RecordTypeError)])
def test_a_key_outside_the_records_is_refused(dataset, key, error):
    with pytest.raises(error):
        GrainSource(dataset)[key]


def test_numpy_integer_keys_read_their_record(dataset):
    assert GrainSource(dataset)[np.int64(2)] == b"third"


def test_a_source_pickled_before_its_dataset_was_rewritten_is_refused_in_the_worker(dataset):
    pickled = pickle.dumps(GrainSource(dataset))
    with varstore.ShardedWriter(dataset, overwrite=True) as writer:
        writer.extend([b"other", b"records", b"now"])
    with pytest.raises(DatasetReplacedError, match="replaced"):
        pickle.loads(pickled)


def test_an_open_source_refuses_to_read_a_rewritten_dataset_and_its_repr_changes(dataset):
    source = GrainSource(dataset)
    saved_repr = repr(source)
    with varstore.ShardedWriter(dataset, overwrite=True) as writer:
        writer.extend([b"other", b"records", b"now"])
    with pytest.raises(DatasetReplacedError):
        source[0]
    assert repr(GrainSource(dataset)) != saved_repr  # Grain refuses the old checkpoint: its source's repr differs

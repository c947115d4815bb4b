"""Property tests: whatever a writer is given, every read path gives back exactly, for every codec."""

from __future__ import annotations

import itertools

import hypothesis.extra.numpy as hnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import varstore
from varstore.format.codecs import ALLOWED_DTYPES

from .test_codec_properties import same

INT64 = st.integers(-(1 << 63), (1 << 63) - 1)
UINT64_ONLY = st.integers(1 << 63, (1 << 64) - 1)


def arrays_of(dtype: str, trailing: tuple[int, ...] = ()) -> st.SearchStrategy[np.ndarray]:
    return hnp.arrays(np.dtype(dtype), st.tuples(st.integers(0, 12), *map(st.just, trailing)))


sample_arrays = st.sampled_from(ALLOWED_DTYPES).flatmap(
    lambda dtype: hnp.arrays(np.dtype(dtype), hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4))
)
leaves = st.none() | st.booleans() | INT64 | UINT64_ONLY | st.floats() | st.text(max_size=20) | st.binary(max_size=40) | sample_arrays
samples = st.recursive(
    leaves,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)

CODEC_CASES = {
    "bytes": ({}, st.binary(max_size=300)),
    "str": ({}, st.text(max_size=60)),
    "msgpack": ({}, samples),
}


def write_shard(path, records, **options) -> varstore.Reader:
    with varstore.Writer(path, **options) as writer:
        for expected_index, record in enumerate(records):
            assert writer.append(record) == expected_index
    return varstore.open(path)


def check_every_read_path(reader, records) -> None:
    assert len(reader) == len(records)
    assert all(same(got, want) for got, want in zip(reader, records, strict=True))
    assert all(same(reader[i], records[i]) for i in range(len(records)))
    assert all(same(reader[i - len(records)], records[i]) for i in range(len(records)))
    indices = list(range(len(records)))[::-1] + list(range(0, len(records), 2))
    assert all(map(same, reader.get_batch(indices), [records[i] for i in indices]))
    assert all(map(same, reader[1:-1], records[1:-1]))
    assert all(map(same, reader[::3], records[::3]))
    reader.verify()


@pytest.mark.parametrize("codec", sorted(CODEC_CASES))
@pytest.mark.parametrize("checksums", [True, False])
def test_records_round_trip(codec, checksums, tmp_path_factory):
    options, strategy = CODEC_CASES[codec]

    @given(st.lists(strategy, max_size=25))
    def run(records):
        path = tmp_path_factory.mktemp("shard") / "records"
        with write_shard(path, records, codec=codec, checksums=checksums, **options) as reader:
            check_every_read_path(reader, records)

    run()


@given(
    st.sampled_from(ALLOWED_DTYPES).flatmap(
        lambda dtype: st.tuples(
            st.just(dtype),
            st.lists(st.integers(1, 3), max_size=2).map(tuple).flatmap(
                lambda trailing: st.tuples(st.just(trailing), st.lists(arrays_of(dtype, trailing), max_size=12))
            ),
        )
    )
)
def test_arrays_round_trip_for_every_dtype_and_trailing_shape(tmp_path_factory, case):
    dtype, (trailing, records) = case
    path = tmp_path_factory.mktemp("shard") / "arrays"
    with write_shard(path, records, codec="ndarray", dtype=dtype, shape=trailing) as reader:
        check_every_read_path(reader, records)
        flat = reader.get_batch_flat(range(len(records)))
        assert flat.values.dtype == np.dtype(dtype)
        assert all(same(flat.values[a:b], record) for a, b, record in zip(flat.offsets, flat.offsets[1:], records))
        assert same(reader.as_array(), np.concatenate(records) if records else np.zeros((0, *trailing), dtype))


@given(st.lists(st.binary(max_size=50), min_size=1, max_size=40), st.data())
def test_flat_batch_packs_the_same_bytes_as_get_batch(tmp_path_factory, records, data):
    indices = data.draw(st.lists(st.integers(-len(records), len(records) - 1), max_size=60))
    with write_shard(tmp_path_factory.mktemp("shard") / "flat", records) as reader:
        flat = reader.get_batch_flat(indices)
        batch = reader.get_batch(indices)
        assert flat.offsets.tolist() == list(itertools.accumulate((len(b) for b in batch), initial=0))
        assert flat.values.tobytes() == b"".join(batch)


def test_record_larger_than_the_write_buffer_round_trips(tmp_path):
    big = np.random.default_rng(1).bytes(3 << 20)
    records = [b"a", big, b"", big[:5]]
    with write_shard(tmp_path / "big", records) as reader:
        check_every_read_path(reader, records)


def test_token_shard_data_file_is_exactly_the_concatenated_tokens(tmp_path):
    documents = [np.arange(n, dtype=np.uint16) * 7 for n in (5, 0, 3, 11)]
    with varstore.Writer(tmp_path / "tokens", codec="ndarray", dtype="uint16") as writer:
        writer.extend(documents)
    assert (tmp_path / "tokens.data").read_bytes() == np.concatenate(documents).astype("<u2").tobytes()


def test_read_arrays_are_read_only_views_of_the_map(tmp_path):
    with write_shard(tmp_path / "views", [np.arange(4, dtype=np.int32)], codec="ndarray", dtype="int32") as reader:
        array = reader[0]
        assert not array.flags.writeable
        assert array.base is not None
        with pytest.raises(ValueError):
            array[0] = 1


@given(st.lists(st.lists(st.integers(0, 65535), max_size=20), max_size=20))
def test_extend_flat_equals_appending_each_record(tmp_path_factory, documents):
    directory = tmp_path_factory.mktemp("flat")
    arrays = [np.array(document, np.uint16) for document in documents]
    with varstore.Writer(directory / "one", codec="ndarray", dtype="uint16") as writer:
        writer.extend(arrays)
    with varstore.Writer(directory / "flat", codec="ndarray", dtype="uint16") as writer:
        values = np.concatenate(arrays) if arrays else np.zeros(0, np.uint16)
        writer.extend_flat(values, [len(array) for array in arrays])
    for suffix in (".index", ".data"):
        assert (directory / f"one{suffix}").read_bytes() == (directory / f"flat{suffix}").read_bytes()


@given(st.lists(st.binary(max_size=40), max_size=40), st.integers(1, 120), st.integers(1, 9))
def test_sharded_dataset_equals_the_concatenation_of_its_shards(tmp_path_factory, records, max_bytes, max_records):
    directory = tmp_path_factory.mktemp("dataset")
    with varstore.ShardedWriter(directory, max_shard_bytes=max_bytes, max_shard_records=max_records) as writer:
        for expected_index, record in enumerate(records):
            assert writer.append(record) == expected_index
    with varstore.open(directory) as dataset:
        shards = [list(varstore.open(path)) for path in dataset.shard_paths]
        assert sum(shards, []) == records
        check_every_read_path(dataset, records)
        indices = list(range(len(records)))[::-1]
        flat = dataset.get_batch_flat(indices)
        assert flat.values.tobytes() == b"".join(records[i] for i in indices)


def test_flat_batch_values_are_writable_whatever_the_number_of_shards(tmp_path):
    with varstore.ShardedWriter(tmp_path, max_shard_records=2) as writer:
        writer.extend([b"ab", b"cd", b"ef"])
    dataset = varstore.open(tmp_path)
    for indices in ([0, 1], [0, 2]):
        assert dataset.get_batch_flat(indices).values.flags.writeable


@given(st.lists(st.lists(st.integers(0, 255), max_size=9), max_size=30), st.integers(1, 7), st.integers(1, 5))
def test_iter_flat_batches_are_the_records_in_order(tmp_path_factory, documents, batch_size, max_records):
    directory = tmp_path_factory.mktemp("iter_flat")
    records = [np.array(document, np.uint8) for document in documents]
    with varstore.ShardedWriter(directory, codec="ndarray", dtype="uint8", shape=(), max_shard_records=max_records) as writer:
        writer.extend(records)
    with varstore.Writer(directory / "single") as writer:
        writer.extend(record.tobytes() for record in records)
    for store in (varstore.open(directory), varstore.open(directory / "single")):
        batches = list(store.iter_flat(batch_size))
        assert all(len(batch.offsets) - 1 <= batch_size and batch.offsets[0] == 0 for batch in batches)
        flattened = [batch.values[a:b].tobytes() for batch in batches for a, b in zip(batch.offsets, batch.offsets[1:])]
        assert flattened == [record.tobytes() for record in records]


@given(st.lists(st.binary(max_size=30), max_size=40), st.integers(1, 80), st.none() | st.integers(1, 6))
def test_sharded_extend_flat_lays_out_shards_as_appending_does(tmp_path_factory, records, max_bytes, max_records):
    directory = tmp_path_factory.mktemp("flat-shards")
    limits = {"max_shard_bytes": max_bytes, "max_shard_records": max_records}
    with varstore.ShardedWriter(directory / "appended", **limits) as writer:
        writer.extend(records)
    with varstore.ShardedWriter(directory / "flat", **limits) as writer:
        writer.extend_flat(b"".join(records), [len(record) for record in records])
    appended, flat = varstore.open(directory / "appended"), varstore.open(directory / "flat")
    assert flat.manifest.shards == appended.manifest.shards
    assert list(flat) == records

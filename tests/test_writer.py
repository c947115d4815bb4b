"""Writer behaviour: atomic commit, refusal to overwrite, clear errors for bad records, constant memory."""

from __future__ import annotations

import errno
import os
import tracemalloc

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

import varstore


def test_append_returns_consecutive_indices(tmp_path):
    with varstore.Writer(tmp_path / "docs") as writer:
        assert [writer.append(b"x" * n) for n in range(5)] == [0, 1, 2, 3, 4]
        assert len(writer) == 5


def test_nothing_is_visible_before_close(tmp_path):
    writer = varstore.Writer(tmp_path / "docs")
    writer.append(b"record")
    assert not (tmp_path / "docs.index").exists() and not (tmp_path / "docs.data").exists()
    with pytest.raises(varstore.MissingFileError):
        varstore.open(tmp_path / "docs")
    writer.close()
    assert varstore.open(tmp_path / "docs")[0] == b"record"


def test_exception_inside_with_leaves_no_shard_and_no_temporary_files(tmp_path):
    with pytest.raises(RuntimeError, match="boom"):
        with varstore.Writer(tmp_path / "docs") as writer:
            writer.append(b"record")
            raise RuntimeError("boom")
    assert os.listdir(tmp_path) == []


def test_existing_shard_is_not_overwritten_unless_asked(tmp_path):
    with varstore.Writer(tmp_path / "docs") as writer:
        writer.append(b"old")
    with pytest.raises(varstore.ShardExistsError, match="docs.index"):
        varstore.Writer(tmp_path / "docs")
    with varstore.Writer(tmp_path / "docs", overwrite=True) as writer:
        writer.append(b"new")
    assert list(varstore.open(tmp_path / "docs")) == [b"new"]


def test_second_writer_of_one_shard_is_refused_while_the_first_lives(tmp_path):
    first = varstore.Writer(tmp_path / "docs")
    first.append(b"first")
    with pytest.raises(varstore.ConcurrentWriterError, match=rf"docs.*pid {os.getpid()}"):
        varstore.Writer(tmp_path / "docs", overwrite=True)
    first.close()
    assert list(varstore.open(tmp_path / "docs")) == [b"first"]
    with varstore.Writer(tmp_path / "docs", overwrite=True) as second:  # the lock went with the first writer
        second.append(b"second")
    assert list(varstore.open(tmp_path / "docs")) == [b"second"]


def assert_only_the_first_of_two_unlocked_writers_publishes(prefix, monkeypatch) -> None:
    """Two writers of one shard with the lock disabled (another machine, say): the later commit is refused."""
    monkeypatch.setattr(varstore.shard.writer, "lock_shard", lambda prefix: None)
    late = varstore.Writer(prefix)
    late.append(b"late")
    with varstore.Writer(prefix) as first:
        first.append(b"first")
    with pytest.raises(varstore.ShardExistsError):
        late.close()
    assert list(varstore.open(prefix)) == [b"first"]


def test_shard_created_meanwhile_is_not_clobbered_at_commit(tmp_path, monkeypatch):
    """Without the lock, the no-clobber link still lets only one writer publish."""
    assert_only_the_first_of_two_unlocked_writers_publishes(tmp_path / "docs", monkeypatch)
    assert sorted(os.listdir(tmp_path)) == ["docs.data", "docs.index"]


@pytest.mark.parametrize("errno_name", ["EPERM", "EOPNOTSUPP", "EXDEV", "EMLINK"])
def test_filesystem_without_hard_links_falls_back_to_check_then_rename(tmp_path, monkeypatch, errno_name):
    def refuse(*args, **kwargs):
        raise OSError(getattr(errno, errno_name), os.strerror(getattr(errno, errno_name)))

    monkeypatch.setattr(os, "link", refuse)
    with varstore.Writer(tmp_path / "docs") as writer:
        writer.append(b"first")
    assert list(varstore.open(tmp_path / "docs")) == [b"first"]
    with pytest.raises(varstore.ShardExistsError):
        varstore.Writer(tmp_path / "docs")
    assert_only_the_first_of_two_unlocked_writers_publishes(tmp_path / "other", monkeypatch)


def test_append_after_close_is_a_closed_error(tmp_path):
    writer = varstore.Writer(tmp_path / "docs")
    writer.close()
    with pytest.raises(varstore.ClosedError):
        writer.append(b"late")


@pytest.mark.parametrize(
    ("codec", "options", "record"),
    [
        ("bytes", {}, "text is not bytes"),
        ("str", {}, b"bytes are not text"),
        ("ndarray", {"dtype": "uint16"}, np.array([1, 70000])),
        ("ndarray", {"dtype": "uint16"}, np.array([-1])),
        ("ndarray", {"dtype": "int32"}, np.array([1.5])),
        ("ndarray", {"dtype": "float32", "shape": [3]}, np.zeros((2, 4), np.float32)),
        ("ndarray", {"dtype": "uint8"}, np.array(["a"])),
        ("msgpack", {}, {"when": object()}),
        ("msgpack", {}, {"big": 1 << 70}),
        ("msgpack", {}, {"objects": np.array([None], dtype=object)}),
    ],
)
def test_record_that_does_not_fit_the_codec_is_refused_and_nothing_written(tmp_path, codec, options, record):
    with varstore.Writer(tmp_path / "docs", codec=codec, **options) as writer:
        with pytest.raises(varstore.RecordTypeError):
            writer.append(record)
        assert len(writer) == 0
    assert len(varstore.open(tmp_path / "docs")) == 0


def test_integer_tokens_in_range_are_stored_exactly(tmp_path):
    with varstore.Writer(tmp_path / "tokens", codec="ndarray", dtype="uint16") as writer:
        writer.append([0, 65535, 12])
    assert varstore.open(tmp_path / "tokens")[0].tolist() == [0, 65535, 12]


@pytest.mark.parametrize(
    ("codec", "options"),
    [("nope", {}), ("ndarray", {}), ("ndarray", {"dtype": "object"}), ("bytes", {"dtype": "uint8"}), ("ndarray", {"dtype": "u2", "shape": [0]})],
)
def test_bad_writer_options_are_refused(tmp_path, codec, options):
    with pytest.raises(varstore.RecordTypeError):
        varstore.Writer(tmp_path / "docs", codec=codec, **options)
    assert os.listdir(tmp_path) == []


def test_metadata_that_is_not_json_is_refused(tmp_path):
    with pytest.raises(varstore.FormatError, match="JSON"):
        varstore.Writer(tmp_path / "docs", metadata={"when": object()})


def test_extend_flat_with_lengths_that_do_not_cover_values_is_refused(tmp_path):
    with varstore.Writer(tmp_path / "tokens", codec="ndarray", dtype="uint16") as writer:
        with pytest.raises(varstore.RecordTypeError, match="lengths cover"):
            writer.extend_flat(np.arange(10, dtype=np.uint16), [3, 3])


def test_extend_flat_copies_non_contiguous_bytes_values_like_append(tmp_path):
    """Regression (attack a08): a strided buffer raised a raw TypeError from memoryview.cast."""
    strided = np.arange(16, dtype=np.uint8).reshape(4, 4)[:, ::2]
    with varstore.Writer(tmp_path / "docs") as writer:
        writer.extend_flat(strided, [3, 5])
        writer.append(memoryview(strided))
    with varstore.open(tmp_path / "docs") as shard:
        assert [shard[i] for i in range(3)] == [strided.tobytes()[:3], strided.tobytes()[3:], strided.tobytes()]


def test_extend_flat_refuses_values_that_are_not_bytes_like(tmp_path):
    with varstore.Writer(tmp_path / "docs") as writer:
        with pytest.raises(varstore.RecordTypeError, match="bytes-like object, not list"):
            writer.extend_flat([1, 2], [2])


def test_writer_creates_missing_parent_directories(tmp_path):
    with varstore.Writer(tmp_path / "a" / "b" / "docs") as writer:
        writer.append(b"x")
    assert varstore.open(tmp_path / "a" / "b" / "docs")[0] == b"x"


def _peak_memory_writing(path, count: int) -> int:
    payload = b"r" * 100  # enough for both runs to fill the 1 MiB data buffer
    tracemalloc.start()
    with varstore.Writer(path) as writer:
        for _ in range(count):
            writer.append(payload)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak


def test_writer_memory_does_not_grow_with_the_record_count(tmp_path, monkeypatch):
    monkeypatch.setattr(varstore.shard.writer, "_SPOOL_ENTRIES", 1024)  # spool often, so small counts show the bound
    small = _peak_memory_writing(tmp_path / "small", 20_000)
    large = _peak_memory_writing(tmp_path / "large", 80_000)
    # Keeping offsets in memory would cost at least 8 bytes per extra record.
    assert large - small < 8 * 60_000 / 4


@pytest.mark.parametrize("codec", ["str", "msgpack"])
def test_extend_flat_refuses_codecs_whose_payloads_it_cannot_check(tmp_path, codec):
    with varstore.Writer(tmp_path / "docs", codec=codec) as writer:
        with pytest.raises(varstore.RecordTypeError, match="encoded one by one"):
            writer.extend_flat(b"\xff\xfe", [2])


ADVERSARIAL_LENGTHS = st.lists(
    st.one_of(
        st.integers(0, 16),
        st.sampled_from([2**31, 2**32 + 3, 2**62, 2**63 - 1, 2**63, 2**63 + 5, 2**64 - 1, 2**61 + 1]),
    ),
    min_size=1,
    max_size=6,
)


@example(lengths=[2**64 - 1, 13], dtype=np.uint64, row=1)
@example(lengths=[2**63, 2**63, 12], dtype=np.uint64, row=1)
@example(lengths=[2**62, 2**62, 12], dtype=np.int64, row=1)
@example(lengths=[6148914691236517206, 6148914691236517206, 6148914691236517206, 12], dtype=np.int64, row=3)
@given(lengths=ADVERSARIAL_LENGTHS, dtype=st.sampled_from([np.uint64, np.int64]), row=st.sampled_from([1, 3]))
def test_extend_flat_lengths_that_overflow_are_refused_never_committed(tmp_path_factory, lengths, dtype, row):
    """Regression (issue 9, item 9): uint64 lengths >= 2**63 committed decreasing offsets, and huge int64
    lengths times the row size wrapped into records of other lengths, which verify() accepted."""
    if dtype is np.int64 and max(lengths) >= 2**63:
        return
    values = np.arange(12 * row, dtype=np.uint16).reshape(12, row)
    path = tmp_path_factory.mktemp("flat") / "tokens"
    with varstore.Writer(path, codec="ndarray", dtype="uint16", shape=[row]) as writer:
        try:
            writer.extend_flat(values, np.array(lengths, dtype=dtype))
        except varstore.RecordTypeError:
            assert sum(lengths) != 12
        else:
            assert sum(lengths) == 12
    with varstore.open(path) as shard:
        shard.verify()
        stored = [len(record) for record in shard]
    assert stored in ([], lengths)
    if stored:
        assert np.concatenate(list(varstore.open(path))).tolist() == values.tolist()


def test_writer_interrupted_while_it_starts_leaves_no_file(tmp_path, monkeypatch):
    """Ctrl-C landing after the temporary files exist: they go at once, not when the writer is garbage-collected
    (a command removing the directory it created must find it empty)."""
    def interrupted(*args, **options):
        raise KeyboardInterrupt

    monkeypatch.setattr(varstore.shard.writer, "write_all", interrupted)
    with pytest.raises(KeyboardInterrupt) as caught:
        varstore.Writer(tmp_path / "docs")
    assert os.listdir(tmp_path) == []
    del caught


@pytest.mark.parametrize("make", [lambda path: varstore.Writer(path, codec="ndarray", dtype="uint16"),
                                  lambda path: varstore.ShardedWriter(path, codec="ndarray", dtype="uint16")],
                         ids=["Writer", "ShardedWriter"])
def test_value_that_does_not_fit_is_refused_naming_the_store_and_the_record(tmp_path, make):
    with make(str(tmp_path / "tokens")) as writer:
        writer.extend([[1, 2], [3]])
        with pytest.raises(varstore.RecordTypeError, match=r"tokens: record 2: values in \[5, 70000\] do not fit uint16"):
            writer.append([5, 70000])

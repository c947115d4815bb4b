"""Batch reads of compressed shards (issue 24's read goals): one numpy pass screens a batch's frame headers and one
python-zstandard call decodes the batch. A batch returns what single reads return, byte for byte, and refuses what
they refuse, naming the record; the screen passes no frame that `check_frame` (the rule) refuses."""

from __future__ import annotations

import json
import tempfile
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("zstandard", reason="compressed shards need the zstd extra: pip install -e '.[zstd]'")

import varstore
from varstore.errors import CorruptRecordError
from varstore.format import compression as zstd_format

DAMAGED = Path(__file__).resolve().parent.parent / "spec" / "vectors" / "compressed" / "damaged"
# §1.6's damaged frames, one record each (a damaged block of §1.7 refuses every record it holds: tests/test_blocks_shard.py)
READ_CASES = sorted(path.stem for path in DAMAGED.glob("*.json")
                    if json.loads(path.read_text())["refused_at"] == "read" and json.loads(path.read_text())["rule"] == "§1.6")
WORDS = ["token", "shard", "frame", "record", "reader", "dictionary", "window", "level", "batch", "segment"]
HUGE_WORDS = 60_000  # about 400 KB of text: a frame of several 128 KiB blocks, which the screen leaves to check_frame


def words(seed: int, count: int) -> str:
    return " ".join(WORDS[(seed * 7 + j * (seed % 5 + 1)) % len(WORDS)] for j in range(count))


def record_of(codec: str, text: str):
    """The record of `codec` that holds `text` (the payload an empty text gives is empty for bytes and str)."""
    if codec == "bytes":
        return text.encode()
    if codec == "str":
        return text
    if codec == "msgpack":
        return {"text": text, "words": len(text.split())}
    return np.array([len(word) for word in text.split()], np.uint16)


def same(codec: str, left, right) -> bool:
    if codec == "ndarray":
        return left.dtype == right.dtype and np.array_equal(left, right)
    return type(left) is type(right) and left == right


@settings(max_examples=30)
@given(
    codec=st.sampled_from(["bytes", "str", "msgpack", "ndarray"]),
    compression=st.sampled_from(["zstd", "zstd-dict"]),
    lengths=st.lists(st.integers(0, 60), min_size=1, max_size=70),
    huge=st.booleans(),
    picks=st.lists(st.integers(0, 10**6), max_size=90),
)
def test_a_batch_returns_what_single_reads_return(codec, compression, lengths, huge, picks):
    """Any batch (duplicates, unsorted, empty records, a record of many blocks) of any codec and compression."""
    texts = [words(seed, length) for seed, length in enumerate(lengths)]
    if huge:
        texts[len(texts) // 2] = words(3, HUGE_WORDS)
    records = [record_of(codec, text) for text in texts]
    options = {"dtype": "uint16"} if codec == "ndarray" else {}
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "shard"
        with varstore.Writer(path, codec, compression=compression, **options) as writer:
            writer.extend(records)
        indices = [pick % len(records) for pick in picks]
        with varstore.open(path) as reader:
            batch = reader.get_batch(indices)
            singles = [reader[index] for index in indices]
            flat = reader.get_batch_flat(indices)
    assert len(batch) == len(singles) == len(indices)
    assert all(same(codec, got, records[index]) for got, index in zip(batch, indices))
    assert all(same(codec, got, records[index]) for got, index in zip(singles, indices))
    if codec in ("bytes", "str"):
        assert flat.values.tobytes() == b"".join(texts[index].encode() for index in indices)


def test_a_batch_reads_the_last_frames_of_a_data_file_smaller_than_the_screen_reads(tmp_path):
    """Frames that start within 26 bytes of the end of the data (a flat batch decodes its own copy of the frames):
    the screen leaves them to check_frame and must not read past the data (one that did failed with IndexError)."""
    records = [b"\x00\x00\x00", b"\xc7" + bytes(7)] * 4
    with varstore.Writer(tmp_path / "tiny", "bytes", compression="zstd") as writer:
        writer.extend(records)
    with varstore.open(tmp_path / "tiny") as reader:
        assert reader.get_batch(range(8)[::-1]) == records[::-1]
        assert reader.get_batch_flat([1, 0]).values.tobytes() == records[1] + records[0]


@pytest.mark.parametrize("name", READ_CASES)
def test_a_batch_holding_a_damaged_frame_is_refused_naming_it_and_the_rest_still_read(name):
    """Each damaged-frame vector of spec §1.6 inside a batch (among duplicates, in both orders) is refused, naming
    its record; a batch without it returns the records single reads return."""
    damaged = json.loads((DAMAGED / f"{name}.json").read_text())["record"]
    with varstore.open(DAMAGED / name / "shard") as reader:
        others = [index for index in range(len(reader)) if index != damaged]
        around = others[::-1] + others
        assert reader.get_batch(around) == [reader[index] for index in around]
        for batch in (others[:3] + [damaged] + others[::-1], [damaged, damaged] + others):
            with pytest.raises(CorruptRecordError) as refusal:
                reader.get_batch(batch)
            assert refusal.value.records == [damaged]
            with pytest.raises(CorruptRecordError) as refusal:
                reader.get_batch_flat(batch)
            assert refusal.value.records == [damaged]


def test_a_bomb_inside_a_batch_is_refused_before_its_content_is_allocated():
    """The bomb's frame declares 64 MiB (its index says a few hundred bytes): a batch around it allocates far less."""
    with varstore.open(DAMAGED / "frame-zstd-bomb" / "shard") as reader:
        batch = [0, 2, 1, 3, 0]
        tracemalloc.start()
        with pytest.raises(CorruptRecordError, match="declares 67108864") as refusal:
            reader.get_batch(batch)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert refusal.value.records == [1]
    assert peak < 1 << 20


def raw_block_frame(size: int, *, window_exponent: int | None = None, descriptor_bits: int = 0) -> bytes:
    """A frame of one raw block of `size` (at least 256) bytes `x`: single-segment, or with a window of
    2**(10 + window_exponent) bytes. libzstd decodes such frames even where spec §1.6 makes them damaged (a block
    over the 128 KiB maximum, a window over 8 MiB in a one-shot decode), so a batch must not rely on it."""
    if window_exponent is None:
        header = bytes([0xA0 | descriptor_bits]) + size.to_bytes(4, "little")  # single segment, 4-byte size
    else:
        header = bytes([0x40 | descriptor_bits, window_exponent << 3]) + (size - 256).to_bytes(2, "little")
    return zstd_format.FRAME_MAGIC + header + ((size << 3) | 1).to_bytes(3, "little") + b"x" * size


@pytest.mark.parametrize(
    ("frame", "refusal"),
    [
        (raw_block_frame(200_000), "a block of 200000 bytes exceeds the frame's block maximum of 131072"),
        (raw_block_frame(300, window_exponent=14), "window of 16777216 bytes exceeds 8388608"),
        (raw_block_frame(300, descriptor_bits=0x08), "reserved bit"),
        (raw_block_frame(300, window_exponent=13), None),  # a window of exactly 8 MiB is within the bound
    ],
)
def test_a_batch_refuses_what_the_spec_refuses_though_libzstd_would_decode_it(frame, refusal):
    good = zstd_format.Compressor(zstd_format.ZSTD, 3).compress(b"frame " * 50)
    data = good + frame + good
    starts, ends = np.array([0, len(good), len(good) + len(frame)]), np.array([len(good), len(good) + len(frame), len(data)])
    size = len(frame) - frame.index(b"x")
    decompressor = zstd_format.Decompressor(zstd_format.ZSTD, None)
    if refusal is None:
        assert decompressor.decompress_many(data, starts, ends, np.array([300, size, 300])) == b"frame " * 50 + b"x" * size + b"frame " * 50
        return
    with pytest.raises(ValueError, match=refusal):
        decompressor.decompress_many(data, starts, ends, np.array([300, size, 300]))


def frames_of(payloads: list[bytes], dictionary: bytes | None) -> tuple[bytes, np.ndarray, np.ndarray, np.ndarray]:
    compressor = zstd_format.Compressor(zstd_format.ZSTD_DICT if dictionary else zstd_format.ZSTD, 3, dictionary)
    frames = [compressor.compress(payload) for payload in payloads]
    ends = np.cumsum([len(frame) for frame in frames])
    return b"".join(frames), ends - [len(frame) for frame in frames], ends, np.array([len(payload) for payload in payloads])


PAYLOADS = [words(seed, seed % 40).encode() for seed in range(40)] + [b"", bytes(300)]
TRAINED = zstd_format.train(PAYLOADS * 8, 3)


def test_the_screen_confirms_every_one_block_frame_a_writer_makes():
    """Writers' frames of records under 128 KiB are confirmed by numpy alone (none is left to check_frame)."""
    for dictionary in (None, TRAINED):
        data, starts, ends, sizes = frames_of(PAYLOADS, dictionary)
        expected = zstd_format._dictionary_number(dictionary) if dictionary else 0
        assert zstd_format.unconfirmed_frames(data + bytes(32), starts, ends, sizes, expected).tolist() == []


@settings(max_examples=300)
@given(
    dictionary=st.booleans(),
    flips=st.lists(st.tuples(st.integers(0, 10**6), st.integers(1, 255)), max_size=4),
    size_changes=st.lists(st.tuples(st.integers(0, 10**6), st.integers(-300, 300)), max_size=2),
    moved=st.integers(0, 10**6),
    shift=st.integers(-3, 3),
    wrong_dictionary=st.booleans(),
)
def test_the_screen_never_confirms_a_frame_check_frame_refuses(dictionary, flips, size_changes, moved, shift, wrong_dictionary):
    """Damage anywhere in a batch (headers above all: most flips land in a frame's first 24 bytes), declared sizes
    off, a frame's end moved, the wrong dictionary expected: every frame the screen confirms, check_frame accepts."""
    data, starts, ends, sizes = frames_of(PAYLOADS, TRAINED if dictionary else None)
    data = bytearray(data)
    for where, mask in flips:
        frame = where % len(starts)
        offset = (where // len(starts)) % (24 if where % 3 else ends[frame] - starts[frame])
        data[min(starts[frame] + offset, len(data) - 1)] ^= mask
    sizes = sizes.copy()
    for where, change in size_changes:
        sizes[where % len(sizes)] = max(0, sizes[where % len(sizes)] + change)
    ends = ends.copy()
    ends[moved % len(ends)] = min(max(starts[moved % len(ends)], ends[moved % len(ends)] + shift), len(data))
    expected = (zstd_format._dictionary_number(TRAINED) if dictionary else 0) ^ (1 if wrong_dictionary else 0)
    data = bytes(data) + bytes(32)
    unconfirmed = set(zstd_format.unconfirmed_frames(data, starts, ends, sizes, expected).tolist())
    for k in set(range(len(starts))) - unconfirmed:
        zstd_format.check_frame(data, int(starts[k]), int(ends[k]), int(sizes[k]), expected)

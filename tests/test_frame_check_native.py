"""The C extension's frame check (`speedups.frame_passes`) passes exactly the frames `check_frame` accepts.

`Decompressor.decompress` asks `frame_passes` first and leaves every frame it does not pass to `check_frame`,
the reference, which decides and words the error; so a read with the extension returns and refuses what a read
without it does, provided the two agree on every frame. Here they are compared on frames zstd writes (with and
without a dictionary, a content size, a checksum, windows smaller than the content), frames built field by field,
random bytes, mutations of valid frames (byte flips, truncations, bytes appended), and every record of every
vector in spec/vectors/compressed/; and a read is shown to take the Python check without the extension.
"""

from __future__ import annotations

import functools
import json
import os
import random
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import varstore
from varstore._native import speedups
from varstore.errors import CorruptRecordError
from varstore.format import compression
from varstore.format.compression import FRAME_MAGIC, MAX_WINDOW_SIZE, check_frame
from varstore.format.header import _HEADER, Header
from varstore.shard import reader as shard_reader

zstandard = pytest.importorskip("zstandard")

ROOT = Path(__file__).resolve().parent.parent
VECTORS = ROOT / "spec" / "vectors" / "compressed"
needs_extension = pytest.mark.skipif(speedups is None, reason="varstore._speedups was not built (or VARSTORE_NO_EXTENSION is set)")


def python_accepts(data: bytes, start: int, end: int, declared: int, expected_dictionary: int) -> bool:
    try:
        check_frame(data, start, end, declared, expected_dictionary)
    except ValueError:
        return False
    return True


def assert_agree(data: bytes, start: int, end: int, declared: int, expected_dictionary: int) -> bool:
    """The two checks' common answer for data[start:end] (which must lie within data)."""
    accepted = python_accepts(data, start, end, declared, expected_dictionary)
    assert speedups.frame_passes(data, start, end, declared, expected_dictionary) is accepted, (
        data[start:end].hex(), declared, expected_dictionary, accepted)
    return accepted


def assert_agree_around(frame: bytes, declared: int, expected_dictionary: int, prefix: bytes = b"", suffix: bytes = b"") -> bool:
    """`assert_agree` on `frame` alone, inside other bytes, and for the neighbouring sizes and dictionaries."""
    data = prefix + frame + suffix
    accepted = assert_agree(data, len(prefix), len(prefix) + len(frame), declared, expected_dictionary)
    for size in (declared - 1, declared + 1, declared + 256, declared ^ (1 << 32)):
        if size >= 0:
            assert_agree(data, len(prefix), len(prefix) + len(frame), size, expected_dictionary)
    for number in (0, expected_dictionary + 1, expected_dictionary ^ 0xFFFFFFFF):
        assert_agree(data, len(prefix), len(prefix) + len(frame), declared, number)
    return accepted


@functools.lru_cache(maxsize=None)
def dictionary() -> zstandard.ZstdCompressionDict:
    generator = random.Random(7)
    words = [bytes(generator.choices(b"abcdefghij klmnop{}:,\"", k=generator.randint(3, 9))) for _ in range(64)]
    samples = [b" ".join(generator.choices(words, k=generator.randint(10, 60))) for _ in range(400)]
    return zstandard.train_dictionary(2048, samples, k=64, d=8, steps=1)


payloads = st.one_of(
    st.binary(max_size=3000),
    st.text(alphabet="abcdefghij klmnop{}:,\"", max_size=3000).map(str.encode),
    st.tuples(st.binary(min_size=1, max_size=3), st.integers(0, 3000)).map(lambda pair: pair[0] * pair[1]),  # RLE blocks
)


@needs_extension
@given(payload=payloads, level=st.integers(1, 9), with_dictionary=st.booleans(), checksum=st.booleans(),
       content_size=st.booleans(), dictionary_id=st.booleans(), small_window=st.booleans(),
       prefix=st.binary(max_size=9), suffix=st.binary(max_size=9))
def test_the_checks_agree_on_every_frame_zstd_writes(payload, level, with_dictionary, checksum, content_size,
                                                     dictionary_id, small_window, prefix, suffix):
    """Frames of python-zstandard: single-segment ones, and with a 1 KiB window frames of many blocks that name
    their window; what varstore writes (a content size, no checksum, its dictionary named) is accepted."""
    parsed = dictionary() if with_dictionary else None
    options = {"write_checksum": checksum, "write_content_size": content_size, "write_dict_id": dictionary_id}
    if small_window:
        parameters = zstandard.ZstdCompressionParameters.from_level(level, window_log=10, **options)
        compressor = zstandard.ZstdCompressor(compression_params=parameters, dict_data=parsed)
    else:
        compressor = zstandard.ZstdCompressor(level=level, dict_data=parsed, **options)
    frame = compressor.compress(payload)
    named = parsed.dict_id() if parsed is not None and dictionary_id else 0
    accepted = assert_agree_around(frame, len(payload), named, prefix, suffix)
    assert accepted == content_size


@st.composite
def built_frames(draw):
    """A frame header of any descriptor and fields, then blocks of any type and size (a raw or reserved block's
    bytes zeros, an RLE block's one byte), the checksum if the descriptor says so, and a drawn ending: the frame's
    declared size and dictionary, as check_frame reads them, come with it."""
    descriptor = draw(st.integers(0, 255))
    single = descriptor & 0x20
    window_byte = draw(st.integers(0, 255)) if not single else None
    id_bytes = (0, 1, 2, 4)[descriptor & 3]
    content_bytes = (1 if single else 0, 2, 4, 8)[descriptor >> 6]
    number = draw(st.integers(0, (1 << 8 * id_bytes) - 1))
    content = draw(st.integers(0, (1 << 8 * content_bytes) - 1))
    frame = bytearray(FRAME_MAGIC) + bytes([descriptor])
    if window_byte is not None:
        frame.append(window_byte)
    frame += number.to_bytes(id_bytes, "little") + content.to_bytes(content_bytes, "little")
    blocks = draw(st.lists(st.tuples(st.integers(0, 3), st.one_of(st.integers(0, 40), st.integers(0, (1 << 21) - 1))),
                           min_size=1, max_size=4))
    for position, (kind, size) in enumerate(blocks):
        last = position == len(blocks) - 1
        frame += (last | kind << 1 | size << 3).to_bytes(3, "little")
        frame += bytes(1 if kind == 1 else min(size, 4000))
    if descriptor & 0x04:
        frame += bytes(4)
    ending = draw(st.sampled_from(["whole", "cut", "longer"]))
    if ending == "cut":
        del frame[draw(st.integers(0, len(frame) - 1)):]
    elif ending == "longer":
        frame += draw(st.binary(min_size=1, max_size=5))
    declared = content + (256 if content_bytes == 2 else 0) if content_bytes else draw(st.integers(0, 1000))
    return bytes(frame), declared, number


@needs_extension
@given(built=built_frames(), prefix=st.binary(max_size=5))
def test_the_checks_agree_on_frames_built_field_by_field(built, prefix):
    """Every descriptor bit, window, ID width and content width, block type and size, at and past the limits."""
    frame, declared, number = built
    assert_agree_around(frame, declared, number, prefix)


@needs_extension
@given(data=st.one_of(st.binary(max_size=64), st.binary(max_size=40).map(FRAME_MAGIC.__add__)),
       declared=st.one_of(st.integers(0, 300), st.integers(0, 2**64 - 1)), expected=st.integers(0, 2**32 - 1),
       cut=st.tuples(st.integers(0, 70), st.integers(0, 70)))
def test_the_checks_agree_on_random_bytes(data, declared, expected, cut):
    start, end = sorted(min(value, len(data)) for value in cut)
    assert_agree(data, 0, len(data), declared, expected)
    assert_agree(data, start, end, declared, expected)


def mutations(frame: bytes, generator: random.Random, reach: int = 300):
    """Each byte within `reach` of either end flipped (a random bit, then all bits), the frame cut there, and a
    byte appended."""
    near_ends = sorted(set(range(min(reach, len(frame)))) | set(range(max(0, len(frame) - reach), len(frame))))
    for position in near_ends:
        for mask in (1 << generator.randrange(8), 0xFF):
            changed = bytearray(frame)
            changed[position] ^= mask
            yield bytes(changed)
    for length in near_ends:
        yield frame[:length]
    yield frame + b"\x00"


@needs_extension
@given(payload=payloads, with_dictionary=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_the_checks_agree_on_every_mutation_of_a_frame_varstore_writes(payload, with_dictionary, seed):
    """Frames as varstore's Compressor writes them, mutated everywhere; a flip of a block's bytes (beyond its
    header) leaves a frame that passes both checks (decoding finds it)."""
    raw = dictionary().as_bytes() if with_dictionary else None
    compressor = compression.Compressor(compression.ZSTD_DICT if raw else compression.ZSTD, 3, raw)
    frame = compressor.compress(payload)
    number = dictionary().dict_id() if raw else 0
    assert assert_agree_around(frame, len(payload), number)
    generator = random.Random(seed)
    for changed in mutations(frame, generator):
        assert_agree(changed, 0, len(changed), len(payload), number)


@needs_extension
@pytest.mark.parametrize("descriptor", [value for value in range(256) if not value & 0x08], ids=lambda value: f"{value:#04x}")
def test_both_checks_accept_a_well_formed_frame_of_every_header_layout(descriptor):
    """Every descriptor without the reserved bit: each dictionary ID and content size width at its smallest and
    largest value (a content size of 2**64 - 1 too), then one empty raw block and the checksum if flagged.
    Accepted exactly when the frame declares its content size; never for another size or dictionary."""
    single = descriptor & 0x20
    id_bytes = (0, 1, 2, 4)[descriptor & 3]
    content_bytes = (1 if single else 0, 2, 4, 8)[descriptor >> 6]
    bonus = 256 if content_bytes == 2 else 0
    for number in {0, (1 << 8 * id_bytes) - 1}:
        for stored in {0, (1 << 8 * content_bytes) - 1, 1 << max(0, 8 * content_bytes - 1)}:
            frame = (FRAME_MAGIC + bytes([descriptor]) + (b"" if single else b"\x00") + number.to_bytes(id_bytes, "little")
                     + (stored if content_bytes else 0).to_bytes(content_bytes, "little") + b"\x01\x00\x00"
                     + (bytes(4) if descriptor & 0x04 else b""))
            declared = stored + bonus if content_bytes else 0
            assert assert_agree_around(frame, declared, number) == bool(content_bytes)


def vector_frames(prefix: Path):
    """Each record of the shard at `prefix` as (data, start, end, declared size, the dictionary's ID), read by
    §1.2 and §1.6's layout without any check a reader makes (some of these shards are refused at open)."""
    index = (prefix.parent / (prefix.name + ".index")).read_bytes()
    data = (prefix.parent / (prefix.name + ".data")).read_bytes()
    (_, _, minor, codec_id, compression_id, flags, count, data_size, metadata_size, data_crc, edge_crc, body_crc,
     reserved, _) = _HEADER.unpack_from(index)
    dictionary_size, dictionary_crc = struct.unpack("<II", reserved)
    header = Header(codec_id, flags, count, data_size, metadata_size, data_crc, edge_crc, body_crc, minor,
                    compression_id, dictionary_size, dictionary_crc)
    raw = index[header.dictionary_start : header.dictionary_start + dictionary_size]
    number = struct.unpack_from("<I", raw, 4)[0] if len(raw) >= 8 else 0
    offsets = struct.unpack_from(f"<{count + 1}Q", index, header.offsets_start)
    sizes = struct.unpack_from(f"<{count}I", index, header.sizes_start)
    for record in range(count):
        yield data, offsets[record], offsets[record + 1], sizes[record], number


def _major_version(prefix: Path) -> int:
    return struct.unpack_from("<H", (prefix.parent / (prefix.name + ".index")).read_bytes(), 8)[0]


# The 2.x shards, whose records are frames (§1.6); a 3.x shard's frames are its blocks' (§1.7: tests/test_blocks_shard.py).
VECTOR_SHARDS = [prefix for prefix in sorted(path.with_suffix("") for path in VECTORS.glob("*.index")) + sorted(
    path.parent / "shard" for path in (VECTORS / "damaged").glob("*/shard.index")) if _major_version(prefix) != 3]


@needs_extension
@pytest.mark.parametrize("prefix", VECTOR_SHARDS, ids=lambda prefix: str(prefix.relative_to(VECTORS)))
def test_the_checks_agree_on_every_record_of_the_compressed_vectors(prefix):
    """Golden and damaged shards alike; each record also mutated, and with no dictionary or another one."""
    frames = list(vector_frames(prefix))
    assert frames
    generator = random.Random(prefix.name)
    for data, start, end, declared, number in frames:
        for expected in (number, 0):
            assert_agree(data, start, end, declared, expected)
        for changed in mutations(data[start:end], generator, reach=64):
            assert_agree(changed, 0, len(changed), declared, number)


DAMAGED_READS = sorted(path.stem for path in (VECTORS / "damaged").glob("*.json")
                       if json.loads(path.read_text())["refused_at"] == "read" and json.loads(path.read_text())["rule"] == "§1.6")


@needs_extension
def test_both_checks_refuse_the_damaged_frames_and_pass_those_only_decoding_refuses():
    """The vectors the reads below refuse: frames the checks refuse (declared size, dictionary, no content size,
    a byte after) and frames both pass that decoding refuses (more than declared, the bomb's 64 MiB)."""
    outcomes = {}
    for name in DAMAGED_READS:
        record = json.loads((VECTORS / "damaged" / f"{name}.json").read_text())["record"]
        data, start, end, declared, number = list(vector_frames(VECTORS / "damaged" / name / "shard"))[record]
        outcomes[name] = assert_agree(data, start, end, declared, number)
    assert not outcomes["frame-followed-by-a-byte"] and not outcomes["frame-of-another-dictionary"]
    assert not outcomes["frame-without-content-size"] and not outcomes["size-disagrees-with-frame"]
    assert not outcomes["frame-zstd-bomb"] and outcomes["frame-decodes-to-more-than-declared"]


@needs_extension
def test_frame_passes_declines_what_it_cannot_read_and_check_frame_decides():
    """Ranges reversed or past the data, negative or over-wide numbers, arguments that are no integers or no
    bytes-like data: False, so that check_frame decides (and raises) as it does without the extension; numpy
    integers count as integers."""
    frame = compression.Compressor(compression.ZSTD, 3).compress(b"record " * 20)
    size = 140
    assert speedups.frame_passes(frame, 0, len(frame), size, 0)
    assert speedups.frame_passes(memoryview(b"x" + frame), 1, len(frame) + 1, size, 0)
    assert speedups.frame_passes(frame, np.int64(0), np.uint32(len(frame)), np.int64(size), np.uint8(0))
    for arguments in [(frame, 1, 0, size, 0), (frame, 0, len(frame) + 1, size, 0), (frame, -1, len(frame), size, 0),
                      (frame, 0, len(frame), -size, 0), (frame, 0, len(frame), size, -1), (frame, 0, 2**64, size, 0),
                      (frame, 0, len(frame), size + 2**64, 0), (frame, 0, len(frame), size, 2**70),
                      (frame, 0.0, len(frame), size, 0), (frame, 0, len(frame), "140", 0), (list(frame), 0, len(frame), size, 0)]:
        assert speedups.frame_passes(*arguments) is False
    with pytest.raises(TypeError):
        speedups.frame_passes(frame, 0, len(frame), size)


def read_outcomes(prefix: Path) -> list[tuple[str, str]]:
    """Each record of the shard read alone: its value's start, or its error's class and message."""
    outcomes = []
    with varstore.open(prefix) as reader:
        for record in range(len(reader)):
            try:
                outcomes.append(("value", repr(reader[record])[:60]))
            except CorruptRecordError as error:
                outcomes.append((type(error).__name__, str(error)))
    return outcomes


@pytest.mark.parametrize("name", DAMAGED_READS)
def test_a_read_without_the_extension_takes_the_python_check_and_ends_the_same(name, monkeypatch):
    """`compression.speedups` None (as VARSTORE_NO_EXTENSION=1 leaves it): every frame goes through check_frame,
    and the records and errors are those of a read with the extension."""
    prefix = VECTORS / "damaged" / name / "shard"
    with_extension = read_outcomes(prefix)
    checked = []
    monkeypatch.setattr(compression, "check_frame", lambda *arguments: checked.append(arguments) or check_frame(*arguments))
    monkeypatch.setattr(compression, "speedups", None)
    monkeypatch.setattr(shard_reader, "speedups", None)  # nor the C extension's frame reads (FrameSlicer)
    assert read_outcomes(prefix) == with_extension
    assert len(checked) == len(with_extension)
    assert any(kind == "CorruptRecordError" for kind, _ in with_extension)


@needs_extension
def test_a_read_with_the_extension_leaves_check_frame_only_the_frames_frame_passes_refuses(monkeypatch):
    damaged = json.loads((VECTORS / "damaged" / "size-disagrees-with-frame.json").read_text())["record"]
    checked = []
    monkeypatch.setattr(compression, "check_frame", lambda *arguments: checked.append(arguments) or check_frame(*arguments))
    outcomes = read_outcomes(VECTORS / "damaged" / "size-disagrees-with-frame" / "shard")
    assert len(checked) == 1 and [kind for kind, _ in outcomes].index("CorruptRecordError") == damaged


@pytest.mark.timeout(600)
def test_varstore_no_extension_reads_compressed_shards_through_the_python_check():
    """The environment variable, in a fresh interpreter: no extension in the compression module, and the damaged
    vectors' reads end as they do here."""
    script = ("import sys; sys.path.insert(0, 'tests'); import test_frame_check_native as t, varstore.format.compression as c; "
              "assert c.speedups is None; print(repr([t.read_outcomes(t.VECTORS / 'damaged' / name / 'shard') for name in t.DAMAGED_READS]))")
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env={**os.environ, "VARSTORE_NO_EXTENSION": "1"},
                            capture_output=True, text=True, timeout=540)
    assert result.returncode == 0, result.stderr
    expected = [read_outcomes(VECTORS / "damaged" / name / "shard") for name in DAMAGED_READS]
    assert result.stdout.strip() == repr(expected)


def test_frames_past_the_window_limit_are_refused_by_both():
    """A frame naming a window of 9 MiB (exponent 13, mantissa 1) is refused; MAX_WINDOW_SIZE, 8 MiB, is not."""
    assert MAX_WINDOW_SIZE == 1 << 10 + 13
    for window_byte, accepted in ((13 << 3, True), (13 << 3 | 1, False)):
        frame = FRAME_MAGIC + bytes([0x80, window_byte]) + (5).to_bytes(4, "little") + (1 | 1 << 1 | 5 << 3).to_bytes(3, "little") + b"a"
        assert python_accepts(frame, 0, len(frame), 5, 0) is accepted
        if speedups is not None:
            assert speedups.frame_passes(frame, 0, len(frame), 5, 0) is accepted

"""Compressed shards (format 2.0, spec/FORMAT.md §1.6, every record one zstd frame; format 3.0, §1.7, blocks of
consecutive records one frame each): the compression ids, a shard's dictionary, a frame's rules, the bounds.

What is on disk and the rules a read checks, with no file I/O: the compression ids of the header, the
dictionary section's checks, a zstd frame's header and extent (RFC 8878 §3.1.1, parsed here, not by the
binding, so that a frame's declared content size is checked before anything is allocated) and the binding
itself (python-zstandard, the optional extra ``varstore[zstd]``), loaded only when a compressed shard is
written or read. `Compressor` and `Decompressor` are the two directions; `choose` is what ``"auto"`` measures.
"""

from __future__ import annotations

import struct
import threading
import time
import weakref
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from .._native import speedups
from .blocks import BLOCK_TARGET, blocks_of
from ..errors import FormatError, VarstoreError

NONE, ZSTD, ZSTD_DICT, ZSTD_BLOCKS, ZSTD_DICT_BLOCKS = 0, 1, 2, 3, 4
NAMES = {NONE: "none", ZSTD: "zstd", ZSTD_DICT: "zstd-dict", ZSTD_BLOCKS: "zstd-blocks", ZSTD_DICT_BLOCKS: "zstd-dict-blocks"}
IDS = {name: number for number, name in NAMES.items()}
CHOICES = ("zstd", "zstd-dict", "zstd-blocks", "zstd-dict-blocks", "auto")  # a writer's `compression`, besides None
PER_RECORD = (ZSTD, ZSTD_DICT)  # format 2.0: one frame per record
BLOCKS = (ZSTD_BLOCKS, ZSTD_DICT_BLOCKS)  # format 3.0: one frame per block of records
WITH_DICTIONARY = (ZSTD_DICT, ZSTD_DICT_BLOCKS)

MAX_DICTIONARY_SIZE = 1 << 20
MAX_WINDOW_SIZE = 1 << 23  # RFC 8878's recommended decoder limit; writers stay within it
SIZE_BYTES = 4  # one u32 decoded size per record in a compressed shard's index
MAX_RECORD_SIZE = (1 << 32) - 1
MIN_LEVEL, MAX_LEVEL = 1, 19  # levels 20-22 need windows over MAX_WINDOW_SIZE

FRAME_MAGIC = b"\x28\xb5\x2f\xfd"
DICTIONARY_MAGIC = b"\x37\xa4\x30\xec"
_BLOCK_MAXIMUM = 128 << 10

# The bounded sample a writer compresses (auto) or trains a dictionary on (zstd-dict): its first records up to
# SAMPLE_BYTES and SAMPLE_RECORDS, trained with fixed cover parameters so training takes about a second at most.
SAMPLE_BYTES = 4 << 20
SAMPLE_RECORDS = 16384
DICTIONARY_SIZE = 112640  # zstd's default, the most a writer trains
# ... and at most this fraction of the sample: a dictionary is stored once per shard, so it must earn its size back
# on the shard's records; tools/bench/compression.py measured 1/50 smallest in total on ~300 B and ~1 KB JSON rows
# (frames plus dictionary 0.4461 and 0.3116 of raw, against 0.4523 and 0.3364 with a 110 KiB one).
DICTIONARY_SAMPLE_FRACTION = 50
MIN_DICTIONARY_SIZE = 1024  # ... but never under 1 KiB, which a sample under 10 KiB is too small for
MIN_TRAINING_BYTES = 10 * MIN_DICTIONARY_SIZE
MIN_TRAINING_RECORDS = 16
# The dictionary path compresses `compression_level` + this. Measured on tools/bench's corpora (frames plus dictionary
# ÷ raw at +0 / +3 / +6 over level 3; one run at load 10-17 on 2 cores): documents 0.230 / 0.204 / 0.198, man pages
# 0.230 / 0.212 / 0.201, metadata 0.310 / 0.291 / 0.284, docstrings 0.446 / 0.446 / 0.439, compressing at
# 41 / 21 / 7.6, 129 / 19 / 8.6, 58 / 12 / 12 and 33 / 8.3 / 6.2 MB/s. +3 is the least that keeps documents within
# 1.10x of the best peer (0.208); +6 saves 2-5% more and writes 1-3x slower.
DICTIONARY_LEVEL_BONUS = 3
# auto: compression pays when the sample shrinks below this fraction of its raw size
WORTHWHILE_RATIO = 0.9
DICTIONARY_GAIN = 0.9  # ... and the dictionary when it gives at most this fraction of plain zstd's size
# auto measures blocks (§1.7) when the sample's records average under this, and chooses them when they store at most
# BLOCKS_GAIN of the per-record choice: a random read of a block decodes the whole block, which only small records
# repay (8 KiB blocks of ~225 B and ~1.1 KB records, with a dictionary, store 0.57x and 0.83x per-record frames).
BLOCKS_UNDER = 2 << 10
BLOCKS_GAIN = 0.9
# ... and, over records stored raw, at most this of their size: a block read decodes ~8 KiB where a raw read is a
# slice, which a tenth saved does not repay (the PNG/JPEG icons of tools/bench stored 0.90 of raw in blocks).
BLOCKS_OVER_RAW = 0.75


def zstandard() -> Any:
    """The python-zstandard module, or an error naming the extra that installs it."""
    try:
        import zstandard as module
    except ImportError:
        raise VarstoreError(
            "compressed shards need the zstandard package: pip install 'varstore[zstd]'"
        ) from None
    return module


def check_level(level: Any) -> int:
    if type(level) is not int or not MIN_LEVEL <= level <= MAX_LEVEL:
        raise VarstoreError(f"compression_level must be an integer from {MIN_LEVEL} to {MAX_LEVEL}, not {level!r}")
    return level


def check_choice(compression: Any) -> str | None:
    if compression is not None and compression not in CHOICES:
        raise VarstoreError(f"compression must be None, {', '.join(map(repr, CHOICES[:-1]))} or 'auto', not {compression!r}")
    return compression


def check_compression(compression: Any, level: Any) -> None:
    """Refuse a writer's `compression` and `level` where a job starts (convert, an engine's driver) rather than in
    every shard it writes: a choice or level out of range, or the zstandard binding missing when one is asked for."""
    check_choice(compression)
    check_level(level)
    if compression is not None:
        zstandard()


# -- what is on disk -----------------------------------------------------------------------------------------


def dictionary_id(raw: bytes, *, path: str) -> int:
    """The Dictionary_ID of a shard's dictionary section (RFC 8878 §5), refusing one that is no zstd dictionary."""
    if len(raw) < 8 or raw[:4] != DICTIONARY_MAGIC:
        raise FormatError("the dictionary does not start with the zstd dictionary magic 37 a4 30 ec", path=path)
    (number,) = struct.unpack_from("<I", raw, 4)
    if number == 0:
        raise FormatError("the dictionary's Dictionary_ID is 0", path=path)
    return number


class FrameHeader(NamedTuple):
    content_size: int | None  # Frame_Content_Size, None when the frame does not declare it
    dictionary_id: int  # 0 when absent
    window_size: int | None  # None for a single-segment frame (its window is its content)
    checksum: bool
    size: int  # bytes of magic and header


def frame_header(data: Any, start: int, end: int) -> FrameHeader:
    """The header of the zstd frame at data[start:end] (RFC 8878 §3.1.1); ValueError if it is none."""
    if end - start < 6 or bytes(data[start : start + 4]) != FRAME_MAGIC:
        raise ValueError("not a zstd frame (no frame magic 28 b5 2f fd)")
    descriptor = data[start + 4]
    if descriptor & 0x08:
        raise ValueError("the frame header's reserved bit is set")
    single_segment = bool(descriptor & 0x20)
    position = start + 5
    window = None
    if not single_segment:
        exponent, mantissa = data[position] >> 3, data[position] & 7
        base = 1 << (10 + exponent)
        window = base + (base >> 3) * mantissa
        position += 1
    id_size = (0, 1, 2, 4)[descriptor & 3]
    content_flag = descriptor >> 6
    content_bytes = (1 if single_segment else 0, 2, 4, 8)[content_flag]
    if position + id_size + content_bytes > end:
        raise ValueError("the record ends inside the frame header")
    number = int.from_bytes(bytes(data[position : position + id_size]), "little")
    position += id_size
    content = None
    if content_bytes:
        content = int.from_bytes(bytes(data[position : position + content_bytes]), "little") + (256 if content_bytes == 2 else 0)
        position += content_bytes
    return FrameHeader(content, number, window, bool(descriptor & 0x04), position - start)


def frame_end(data: Any, start: int, end: int, header: FrameHeader) -> int:
    """Where the frame at data[start:end] ends: after its last block and its checksum (RFC 8878 §3.1.1.2)."""
    position = start + header.size
    block_limit = min(header.window_size or header.content_size or 0, _BLOCK_MAXIMUM)
    while True:
        if position + 3 > end:
            raise ValueError("the record ends inside a block header")
        value = data[position] | data[position + 1] << 8 | data[position + 2] << 16
        last, kind, size = value & 1, (value >> 1) & 3, value >> 3
        if kind == 3:
            raise ValueError("a block of the reserved type 3")
        if size > block_limit and not (kind == 0 and size == 0):
            raise ValueError(f"a block of {size} bytes exceeds the frame's block maximum of {block_limit}")
        position += 3 + (1 if kind == 1 else size)
        if last:
            break
    position += 4 if header.checksum else 0
    if position > end:
        raise ValueError("the record ends inside the frame")
    return position


def check_frame(data: Any, start: int, end: int, declared: int, expected_dictionary: int) -> None:
    """Refuse (ValueError) the record data[start:end] unless it is exactly one zstd frame that declares `declared`
    content bytes, names `expected_dictionary` (0: none), and has a window within MAX_WINDOW_SIZE (§1.6)."""
    header = frame_header(data, start, end)
    if header.content_size is None:
        raise ValueError("the frame does not declare its content size")
    if header.content_size != declared:
        raise ValueError(f"the frame declares {header.content_size} content bytes, the index {declared}")
    if header.window_size is not None and header.window_size > MAX_WINDOW_SIZE:
        raise ValueError(f"the frame's window of {header.window_size} bytes exceeds {MAX_WINDOW_SIZE}")
    if header.dictionary_id != expected_dictionary:
        expected = f"dictionary {expected_dictionary}" if expected_dictionary else "no dictionary"
        raise ValueError(f"the frame names dictionary {header.dictionary_id}, the shard's frames name {expected}")
    stop = frame_end(data, start, end, header)
    if stop != end:
        raise ValueError(f"{end - stop} bytes follow the frame")


_SCREEN_BYTES = 26  # a frame's longest header (18 bytes), then its first block's header read as a u64 word
_ID_BYTES = np.array([0, 1, 2, 4])
_MASKS = np.array([(1 << 8 * width) - 1 for width in range(9)], np.uint64)  # the low `width` bytes of a u64


def unconfirmed_frames(data: Any, starts: np.ndarray, ends: np.ndarray, sizes: np.ndarray, expected_dictionary: int) -> np.ndarray:
    """Positions k of the frames data[starts[k]:ends[k]] (int64 arrays) that one numpy pass over the batch cannot
    confirm `check_frame` accepts; `check_frame` (the rule, with its message) decides each of those. Confirmed are
    frames of one last block whose header, block and end `check_frame` accepts; frames of many blocks (large
    records) and frames within 26 bytes of the data's end are left to it."""
    view = np.frombuffer(data, np.uint8)
    if len(view) < _SCREEN_BYTES:
        return np.arange(len(starts))
    # words[p]: the u64 little-endian at byte p of the data (an unaligned, zero-copy view)
    words = np.lib.stride_tricks.as_strided(view, (len(view) - 7, 8), (1, 1)).view("<u8")[:, 0]
    lengths = ends - starts
    at = np.minimum(starts, len(view) - _SCREEN_BYTES)
    first = words[at]
    descriptor = ((first >> np.uint64(32)) & np.uint64(0xFF)).astype(np.int64)
    window_byte = ((first >> np.uint64(40)) & np.uint64(0xFF)).astype(np.int64)
    single = (descriptor & 0x20) != 0
    id_size = _ID_BYTES[descriptor & 3]
    content_flag = descriptor >> 6
    content_size = np.where(content_flag == 0, single, 1 << content_flag)
    id_at = 6 - single
    content_at = id_at + id_size
    header_size = content_at + content_size
    base = np.left_shift(1, 10 + (window_byte >> 3))
    window = base + (base >> 3) * (window_byte & 7)
    number = words[at + id_at] & _MASKS[id_size]
    content = (words[at + content_at] & _MASKS[content_size]).astype(np.int64) + np.where(content_size == 2, 256, 0)
    block = (words[at + header_size] & np.uint64(0xFFFFFF)).astype(np.int64)
    kind, block_size = (block >> 1) & 3, block >> 3
    block_limit = np.minimum(np.where(single, sizes, window), _BLOCK_MAXIMUM)
    confirmed = (
        (starts + _SCREEN_BYTES <= len(view)) & (lengths >= header_size + 3)
        & ((first & np.uint64(0xFFFFFFFF)) == int.from_bytes(FRAME_MAGIC, "little")) & ((descriptor & 0x08) == 0)
        & (content_size > 0) & (content == sizes) & (single | (window <= MAX_WINDOW_SIZE))
        & (number == expected_dictionary) & ((block & 1) == 1) & (kind != 3)
        & ((block_size <= block_limit) | ((kind == 0) & (block_size == 0)))
        & (header_size + 3 + np.where(kind == 1, 1, block_size) + np.where(descriptor & 0x04, 4, 0) == lengths)
    )
    return np.flatnonzero(~confirmed)


# -- decompression -------------------------------------------------------------------------------------------


class Decompressor:
    """Decodes one compressed shard's frames. One instance per dictionary is shared by every reader of the process
    (`shared_decompressor`): the dictionary is parsed once, each thread has a zstd context of its own (contexts are
    not thread-safe), and both are freed with the last reader that holds them."""

    def __init__(self, compression: int, dictionary: bytes | None) -> None:
        self.compression = compression
        self.dictionary = dictionary
        self.dictionary_id = _dictionary_number(dictionary) if dictionary else 0
        self._module = zstandard()
        self._parsed = (
            self._module.ZstdCompressionDict(dictionary, dict_type=self._module.DICT_TYPE_FULLDICT) if dictionary else None
        )
        self._local = threading.local()

    def _context(self) -> Any:
        """This thread's zstd context, made on its first use; ValueError if zstd cannot load the dictionary (§1.6:
        found when a frame is decoded with it, so every read of the shard fails)."""
        try:
            return self._local.context
        except AttributeError:
            options: dict[str, Any] = {"dict_data": self._parsed} if self._parsed is not None else {}
            try:
                context = self._local.context = self._module.ZstdDecompressor(max_window_size=MAX_WINDOW_SIZE, **options)
            except self._module.ZstdError as error:
                raise ValueError(f"the shard's dictionary is no zstd dictionary that zstd can load: {error}") from None
            return context

    def thread_decompress(self) -> Any:
        """This thread's zstd context's ``decompress(frame, max_output_size)``, unchecked: for a caller that
        checked the frame itself (the C extension's `FrameSlicer`, `BlockSlicer`) and keeps to this thread. Without
        a context (a dictionary zstd cannot load) a function that raises `_context`'s ValueError: the caller
        declines to the path that refuses the read by record."""
        try:
            return self._context().decompress
        except ValueError as error:
            reason = str(error)

            def refuse(frame: Any, size: int) -> bytes:
                raise ValueError(reason)

            return refuse

    def decompress(self, data: Any, start: int, end: int, size: int) -> bytes:
        """The frame data[start:end], checked before `size` bytes are allocated for it: by the C extension's
        `frame_passes` (which passes only what `check_frame` accepts), else by `check_frame`, which words the error.
        zstd allocates the frame's declared content size, which the check holds to `size`."""
        if speedups is None or not speedups.frame_passes(data, start, end, size, self.dictionary_id):
            check_frame(data, start, end, size, self.dictionary_id)
        try:
            context = self._local.context  # `_context()` without a call, once this thread has one
        except AttributeError:
            context = self._context()
        try:
            return context.decompress(data[start:end], size)  # size: max_output_size, passed by position (faster)
        except self._module.ZstdError as error:
            raise ValueError(f"the frame does not decode: {error}") from None

    def decompress_many(self, data: Any, starts: np.ndarray, ends: np.ndarray, sizes: np.ndarray) -> bytes:
        """Frames data[starts[k]:ends[k]], each checked, decoded back to back in one call that releases the GIL:
        the decoded bytes (frame k's at the sum of sizes[:k]). A batch whose call fails is decoded frame by
        frame, so the error names its frame."""
        starts, ends, sizes = (np.asarray(values, np.int64) for values in (starts, ends, sizes))
        for k in unconfirmed_frames(data, starts, ends, sizes, self.dictionary_id).tolist():
            check_frame(data, int(starts[k]), int(ends[k]), int(sizes[k]), self.dictionary_id)
        # Empty records are left out: python-zstandard 0.25 frees twice a batch whose output is empty.
        filled = np.flatnonzero(sizes)
        if len(filled) < len(sizes):
            starts, ends, sizes = starts[filled], ends[filled], sizes[filled]
        if len(sizes) < 2:
            return self.decompress(data, int(starts[0]), int(ends[0]), int(sizes[0])) if len(sizes) else b""
        module = self._module
        segments = np.empty((len(sizes), 2), np.uint64)
        segments[:, 0], segments[:, 1] = starts, ends - starts
        frames = module.BufferWithSegments(data, segments.tobytes())
        try:
            return b"".join(self._context().multi_decompress_to_buffer(frames, decompressed_sizes=sizes.astype(np.uint64).tobytes()))
        except module.ZstdError as error:
            for start, end, size in zip(starts.tolist(), ends.tolist(), sizes.tolist()):
                self.decompress(data, start, end, size)
            raise ValueError(f"the frames do not decode: {error}") from None
        finally:
            del frames  # the batch's hold on `data`, a map that is closed later


_SHARED: weakref.WeakValueDictionary[tuple[int, bytes], Decompressor] = weakref.WeakValueDictionary()
_SHARED_LOCK = threading.Lock()


def shared_decompressor(compression: int, dictionary: bytes | None) -> Decompressor:
    """The process's `Decompressor` for shards of `compression` with `dictionary` (its bytes, whose CRC32C the
    caller checked): every reader of a shard, and of shards sharing a dictionary, gets the same one while any
    holds it, so that a dataset of many shards keeps only the dictionaries of its open shards."""
    key = (compression, dictionary or b"")
    with _SHARED_LOCK:
        found = _SHARED.get(key)
        if found is None:
            found = _SHARED[key] = Decompressor(compression, dictionary)
    return found


def _dictionary_number(raw: bytes) -> int:
    (number,) = struct.unpack_from("<I", raw, 4)
    return number


# -- compression ---------------------------------------------------------------------------------------------


class Compressor:
    """Compresses a shard's payloads, each into one frame that declares its size (and names the dictionary)."""

    def __init__(self, compression: int, level: int, dictionary: bytes | None = None) -> None:
        module = zstandard()
        self.compression = compression
        self.level = level
        self.dictionary = dictionary
        parsed = module.ZstdCompressionDict(dictionary, dict_type=module.DICT_TYPE_FULLDICT) if dictionary else None
        self._context = module.ZstdCompressor(level=level, dict_data=parsed, write_checksum=False, write_content_size=True)
        self.compress = self._context.compress

    def compress_all(self, payloads: Sequence[Any]) -> list[bytes]:
        compress = self.compress
        return [compress(payload) for payload in payloads]


def train(samples: Sequence[bytes], level: int) -> bytes | None:
    """A dictionary trained on `samples` (already bounded by the caller) of a fiftieth of their bytes (1 to 110
    KiB), or None when they are too few or too small to train one (under 10 KiB, or zstd refuses)."""
    module = zstandard()
    total = sum(map(len, samples))
    if len(samples) < MIN_TRAINING_RECORDS or total < MIN_TRAINING_BYTES:
        return None
    size = min(DICTIONARY_SIZE, max(MIN_DICTIONARY_SIZE, total // DICTIONARY_SAMPLE_FRACTION))
    try:
        trained = module.train_dictionary(size, list(samples), k=200, d=8, steps=0, level=level)
    except module.ZstdError:
        return None
    raw = trained.as_bytes()
    return raw if len(raw) <= MAX_DICTIONARY_SIZE else None


class Choice(NamedTuple):
    """What a writer's bounded sample decided: the compression, its dictionary, and what was measured."""

    compression: int
    dictionary: bytes | None
    level: int
    measured: dict[str, Any]  # for the metadata's "compression" member


def choose(requested: str, samples: Sequence[bytes], level: int) -> Choice:
    """Decide from the first records (`samples`, within SAMPLE_BYTES and SAMPLE_RECORDS) how a shard is stored.

    ``zstd-dict`` and ``zstd-dict-blocks`` train a dictionary (falling back to plain ``zstd`` and ``zstd-blocks``
    when the sample is too small to train one); ``auto`` also measures: raw when zstd saves less than a tenth
    (tokens, JPEGs), the dictionary when it saves a tenth of plain zstd's size, else plain zstd; and for records
    averaging under `BLOCKS_UNDER`, blocks (with or without the dictionary, by the same rule) when they store at
    most `BLOCKS_GAIN` of that choice (`BLOCKS_OVER_RAW` of a raw one). The sample's ratios are recorded in the metadata.
    """
    raw = sum(map(len, samples))
    dictionary_level = min(MAX_LEVEL, level + DICTIONARY_LEVEL_BONUS)
    if requested in ("zstd", "zstd-blocks"):
        return Choice(IDS[requested], None, level, {})
    started = time.perf_counter()
    dictionary = train(samples, dictionary_level)
    if requested in ("zstd-dict", "zstd-dict-blocks"):
        with_dictionary, plain = (ZSTD_DICT, ZSTD) if requested == "zstd-dict" else (ZSTD_DICT_BLOCKS, ZSTD_BLOCKS)
        return Choice(with_dictionary, dictionary, dictionary_level, {}) if dictionary else Choice(plain, None, level, {})
    ratios = _sample_ratios(samples, raw, level, dictionary_level, dictionary)
    measured = {"sample_records": len(samples), "sample_bytes": raw, "sample_ratios": ratios,
                "sample_seconds": round(time.perf_counter() - started, 3)}
    if raw == 0 or ratios["zstd"] > WORTHWHILE_RATIO and ratios.get("zstd-dict", 1.0) > WORTHWHILE_RATIO:
        choice = Choice(NONE, None, level, measured)
    else:
        choice = _better(ZSTD, ratios, dictionary, level, dictionary_level, measured)
    if "zstd-blocks" in ratios:
        in_blocks = _better(ZSTD_BLOCKS, ratios, dictionary, level, dictionary_level, measured)
        gain = BLOCKS_OVER_RAW if choice.compression == NONE else BLOCKS_GAIN
        if ratios[NAMES[in_blocks.compression]] <= gain * ratios.get(NAMES[choice.compression], 1.0):
            return in_blocks
    return choice


def _sample_ratios(samples: Sequence[bytes], raw: int, level: int, dictionary_level: int, dictionary: bytes | None) -> dict[str, float]:
    """Stored ÷ raw for the sample as each compression would store it (a dictionary counted in its shard's size):
    per-record frames, and blocks when the records average under `BLOCKS_UNDER`."""
    ratios: dict[str, float] = {}
    measured = [(ZSTD, samples)]
    if raw and raw < BLOCKS_UNDER * len(samples):
        measured.append((ZSTD_BLOCKS, blocks_of(samples)))
    for plain, payloads in measured:
        ratios[NAMES[plain]] = _ratio(sum(map(len, Compressor(plain, level).compress_all(payloads))), raw)
        if dictionary:
            compressor = Compressor(plain + 1, dictionary_level, dictionary)  # ZSTD_DICT, ZSTD_DICT_BLOCKS
            ratios[NAMES[plain + 1]] = _ratio(len(dictionary) + sum(map(len, compressor.compress_all(payloads))), raw)
    return ratios


def _better(plain: int, ratios: dict[str, float], dictionary: bytes | None, level: int, dictionary_level: int,
            measured: dict[str, Any]) -> Choice:
    """`plain` (ZSTD or ZSTD_BLOCKS), or its dictionary form when that stores at most DICTIONARY_GAIN of it."""
    with_dictionary = NAMES[plain + 1]
    if with_dictionary in ratios and ratios[with_dictionary] <= DICTIONARY_GAIN * ratios[NAMES[plain]]:
        return Choice(plain + 1, dictionary, dictionary_level, measured)
    return Choice(plain, None, level, measured)


def _ratio(stored: int, raw: int) -> float:
    return round(stored / raw, 4) if raw else 1.0


def metadata_member(choice: Choice, requested: str) -> dict[str, Any]:
    """The metadata's ``"compression"`` member for a shard written with `choice` (§1.6, §1.7)."""
    member: dict[str, Any] = {"name": NAMES[choice.compression]}
    if choice.compression != NONE:
        member["level"] = choice.level
    if choice.compression in BLOCKS:
        member["block_size"] = BLOCK_TARGET  # informative (§1.7): what the writer closes a block at
    if requested == "auto":
        member["auto"] = choice.measured
    return member

"""Round-4 attacks on verification: the C chunk check (`speedups.verify_checksums`) fed forged offsets, checksums
and CRCs; shards truncated in place, replaced or turned into a FIFO around a verify; and `verify(workers=N)` with
a billion workers, a progress callback that raises, and Ctrl-C while worker threads run."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import varstore
from varstore._native import speedups
from varstore.operations.verify import verify

from .helpers_cli import write_dataset

RECORD_BYTES = 3000
SHARDS = 4
CHILD_TIMEOUT = 150  # a safety net for a child that would hang; never a measure of speed

needs_extension = pytest.mark.skipif(speedups is None, reason="varstore._speedups was not built")


@pytest.fixture
def dataset(tmp_path):
    """Four shards of five 3000-byte records; record i is filled with byte i."""
    return write_dataset(tmp_path / "ds", [bytes([index]) * RECORD_BYTES for index in range(5 * SHARDS)], max_shard_records=5)


def run_child(script: str, *arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script), *arguments], check=False, capture_output=True,
                          text=True, timeout=CHILD_TIMEOUT, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def offsets(*values: int) -> np.ndarray:
    return np.array(values, "<u8")


@needs_extension
@pytest.mark.parametrize(("data", "bounds", "checksums", "message"), [
    (b"ab", offsets(2, 1, 4), None, "below the one before it"),                  # decreasing
    (b"ab", offsets(2**64 - 1, 0, 1), b"\0" * 8, "below the one before it"),     # wraps past 2**64
    (b"ab", offsets(0, 1, 3), b"\0" * 8, "span 3 bytes but data holds 2"),       # past the data
    (b"", offsets(2**63, 2**63 + 1), b"\0" * 4, "span 1 bytes but data holds 0"),  # 2**63, past the data
    (b"ab", offsets(0, 2).astype(">u8"), None, "data holds 2"),                  # byte-swapped offsets
    (b"ab", offsets(0, 1, 2), b"\0" * 7, "need 8 bytes of checksums, got 7"),   # a checksum array too short
    (b"ab", offsets(0, 1, 2), b"\0" * 12, "need 8 bytes of checksums, got 12"),  # ... and too long
    (b"ab", b"\0" * 12, None, "got 12 bytes"),                                   # not whole uint64s
    (b"", b"", None, "got 0 bytes"),                                             # no offset at all
])
def test_forged_chunk_offsets_and_checksums_are_refused_not_read(data, bounds, checksums, message):
    with pytest.raises(ValueError, match=message):
        speedups.verify_checksums(data, bounds, checksums, 0)


@needs_extension
@pytest.mark.parametrize(("crc", "error"), [(-1, OverflowError), (2**32, ValueError), (1.5, TypeError)])
def test_a_running_crc_outside_32_bits_is_refused(crc, error):
    with pytest.raises(error):
        speedups.verify_checksums(b"ab", offsets(0, 2), None, crc)


@needs_extension
def test_a_chunk_of_only_empty_records_at_offset_2_63_checks_clean():
    from crc32c import crc32c

    empty_crc = crc32c(b"")
    assert speedups.verify_checksums(b"", offsets(2**63, 2**63, 2**63), np.array([empty_crc, 1], "<u4"), 7) == (7, [1])


def test_verify_of_a_data_file_truncated_in_place_after_open_is_an_error_not_sigbus(dataset):
    child = run_child("""
        import os, sys, varstore
        with varstore.open(sys.argv[1]) as reader:
            reader.shard(1)  # mapped while whole
            os.truncate(os.path.join(sys.argv[1], "shard-000001.data"), 100)
            try:
                reader.verify()
            except varstore.VarstoreError as error:
                print("refused:", type(error).__name__)
        """, str(dataset))
    assert child.returncode == 0, child.stderr[-2000:]
    assert "refused:" in child.stdout


def test_a_data_file_that_is_a_fifo_is_reported_damaged_without_hanging(dataset):
    """Opening a FIFO for reading blocks until a writer comes: verify must not open it (the child's timeout is the net)."""
    os.unlink(dataset / "shard-000002.data")
    os.mkfifo(dataset / "shard-000002.data")
    child = run_child("""
        import sys
        from varstore.operations.verify import verify
        report = verify(sys.argv[1], workers=2)
        print([check.name for check in report.bad_shards])
        """, str(dataset))
    assert child.returncode == 0, child.stderr[-2000:]
    assert child.stdout.strip() == "['shard-000002']"


def test_a_billion_workers_verify_a_small_dataset_like_one(dataset):
    """ThreadPoolExecutor starts threads only as items come, so 10**9 workers cost four threads here."""
    assert verify(dataset, workers=10**9).ok
    with varstore.open(dataset) as reader:
        reader.verify(workers=10**9)


class ProgressFailure(Exception):
    pass


@pytest.mark.parametrize("workers", [1, 3])
def test_a_progress_callback_that_raises_stops_verify_with_its_error(dataset, workers):
    def progress(amount):
        raise ProgressFailure(amount)

    with varstore.open(dataset) as reader, pytest.raises(ProgressFailure):
        reader.verify(progress, workers=workers)


@pytest.mark.parametrize("workers", [1, 3])
def test_a_shard_replaced_mid_verify_is_reported_not_mixed(dataset, tmp_path, workers):
    """While shard 0 is checked, shard 3 is replaced by another dataset's shard 3 (other bytes, same size): the
    report names shard 3 as failing its manifest entry, never as ok."""
    other = write_dataset(tmp_path / "other", [bytes([200 + index]) * RECORD_BYTES for index in range(5 * SHARDS)],
                          max_shard_records=5)
    replaced = []

    def replace_shard_3(total, unit):
        class Advance:
            def __enter__(self):
                return self.advance

            def __exit__(self, *exc):
                return None

            def advance(self, amount):
                if not replaced:
                    for suffix in (".index", ".data"):
                        os.replace(other / f"shard-000003{suffix}", dataset / f"shard-000003{suffix}")
                    replaced.append(True)

        return Advance()

    report = verify(dataset, workers=workers, progress=replace_shard_3)
    assert replaced
    assert [check.name for check in report.bad_shards] == ["shard-000003"]


def test_ctrl_c_during_verify_with_workers_exits_promptly_with_keyboard_interrupt(tmp_path):
    """SIGINT arrives (from the first progress report, on a worker thread) while the main thread waits on the pool:
    the process must end with KeyboardInterrupt once running shards finish, not hang (the child's timeout is the net)."""
    dataset = write_dataset(tmp_path / "big", [bytes(RECORD_BYTES)] * 400, max_shard_records=10)
    child = run_child("""
        import os, signal, sys
        import varstore
        signal.signal(signal.SIGINT, signal.default_int_handler)  # a suite started in the background ignores SIGINT
        sent = []
        def progress(amount):
            if not sent:
                sent.append(True)
                os.kill(os.getpid(), signal.SIGINT)
        with varstore.open(sys.argv[1]) as reader:
            try:
                reader.verify(progress, workers=4)
            except KeyboardInterrupt:
                print("interrupted")
                sys.exit(130)
        print("finished without the interrupt")
        """, str(dataset))
    assert child.returncode == 130, child.stderr[-2000:]
    assert child.stdout.strip() == "interrupted"


def test_ctrl_c_during_cli_verify_with_workers_prints_interrupted_and_exits_130(tmp_path):
    dataset = write_dataset(tmp_path / "big", [bytes(RECORD_BYTES)] * 400, max_shard_records=10)
    child = run_child("""
        import os, signal, sys
        import varstore.shard.reader as reader_module
        from varstore.cli import main
        signal.signal(signal.SIGINT, signal.default_int_handler)  # a suite started in the background ignores SIGINT
        real_verify = reader_module.Reader.verify
        sent = []
        def verify_after_an_interrupt(self, progress=None):
            if not sent:
                sent.append(True)
                os.kill(os.getpid(), signal.SIGINT)
            return real_verify(self, progress)
        reader_module.Reader.verify = verify_after_an_interrupt
        sys.exit(main(["verify", "--workers", "4", sys.argv[1]]))
        """, str(dataset))
    assert child.returncode == 130, child.stderr[-2000:]
    assert child.stderr.strip().splitlines()[-1] == "varstore verify: interrupted"


@needs_extension
@pytest.mark.parametrize("length", [(1 << 24) + 3, (1 << 25) + 4091])
def test_one_record_past_16_mib_checks_as_the_crc32c_package_does_at_any_alignment(length):
    """Past SHIFT_TABLE * 2**12 bytes the C code's shift over the record takes x_power_large[k] for k >= 12."""
    from crc32c import crc32c

    buffer = np.random.default_rng(length).bytes(length + 7)
    for shift in (0, 5):
        data = memoryview(buffer)[shift : shift + length]
        expected = crc32c(data)
        bounds = offsets(2**40, 2**40 + length)
        assert speedups.verify_checksums(data, bounds, np.array([expected], "<u4"), 99) == (crc32c(data, 99), [])
        assert speedups.verify_checksums(data, bounds, np.array([expected ^ 1], "<u4"), 0) == (expected, [0])


@needs_extension
@pytest.mark.parametrize("cuts", [
    [0, 10, 5, 40],           # decreasing
    [0, 10, 50, 40],          # past the data
    [0, 2**63, 40],           # 2**63
    [0, 2**64 - 1, 40],       # the largest uint64
], ids=["decreasing", "past-the-data", "2**63", "2**64-1"])
def test_a_shard_with_forged_offsets_fails_verify_with_the_same_corrupt_record_error_with_and_without_c(tmp_path, cuts):
    """Every checksum recomputed by the forger: only the offsets' rules catch it, before any C checksumming reads."""
    from varstore.errors import CorruptRecordError

    from .test_reader_damage import forge_shard
    from .test_speedups import extension_disabled

    errors = []
    for disabled in (False, True):
        path = forge_shard(tmp_path / f"forged-{int(disabled)}", "bytes", bytes(range(40)), cuts, checksums=True)
        with (extension_disabled() if disabled else contextlib.nullcontext(), varstore.open(path) as reader,
              pytest.raises(CorruptRecordError) as refused):
            reader.verify()
        errors.append((str(refused.value).replace(path, "<shard>"), refused.value.records))
    assert errors[0] == errors[1]


def test_a_data_file_truncated_while_verify_reads_it_is_an_error_not_a_pass(tmp_path):
    """Shard 0's data (4 MiB, read 1 MiB at a time with pread) is cut to 1.5 MiB at the first progress report."""
    dataset = write_dataset(tmp_path / "cut", [bytes([n]) * (1 << 20) for n in range(8)], max_shard_records=4)
    cut = []

    def truncate_at_first_report(amount):
        if not cut:
            cut.append(True)
            os.truncate(dataset / "shard-000000.data", 3 << 19)

    with varstore.open(dataset) as reader, pytest.raises(varstore.VarstoreError, match="shard-000000"):
        reader.verify(truncate_at_first_report)
    assert cut

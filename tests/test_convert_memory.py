"""What converting a folder holds in memory (issue 23, item 3): each file is read once, straight into the record
that is written, so a 64 MiB file raises the peak resident set by about 64 MiB (it was read, then copied twice:
191 MiB); a file the address space cannot hold is a one-line error; and the records are byte for byte what the
msgpack codec writes for the same samples."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

import varstore
from varstore.conversion import convert
from varstore.errors import VarstoreError

LARGE_FILE = 64 << 20
# How long a conversion subprocess may take before the test fails: a safety net against a hang, far above the
# seconds a 64 MiB conversion takes on a busy machine.
SUBPROCESS_SAFETY_NET_S = 600
# One BLAS thread in the subprocesses: a many-core machine's BLAS buffers would otherwise weigh on the address space.
QUIET_ENVIRONMENT = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
PEAK_OF_A_CONVERSION = """
import resource, sys
from varstore.conversion import convert
convert(sys.argv[1], sys.argv[2])
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def folder_of_one_file(folder: Path, size: int) -> Path:
    """A folder holding one file of `size` bytes (sparse: zeros that cost the disk nothing to read)."""
    folder.mkdir()
    with open(folder / "file.bin", "wb") as file:
        file.truncate(size)
    return folder


def peak_resident_bytes_of_converting(source: Path, destination: Path) -> int:
    done = subprocess.run([sys.executable, "-c", PEAK_OF_A_CONVERSION, str(source), str(destination)], check=True,
                          capture_output=True, text=True, timeout=SUBPROCESS_SAFETY_NET_S, env=QUIET_ENVIRONMENT)
    return int(done.stdout) * (1 if sys.platform == "darwin" else 1024)  # ru_maxrss: bytes on macOS, KiB elsewhere


@pytest.mark.timeout(2 * SUBPROCESS_SAFETY_NET_S + 300)
def test_converting_a_folder_holds_its_largest_file_about_once(tmp_path: Path) -> None:
    small = peak_resident_bytes_of_converting(folder_of_one_file(tmp_path / "small", 1), tmp_path / "small-dataset")
    large = peak_resident_bytes_of_converting(folder_of_one_file(tmp_path / "large", LARGE_FILE), tmp_path / "large-dataset")
    assert large - small <= 1.5 * LARGE_FILE, f"a {LARGE_FILE:,}-byte file raised the peak by {large - small:,} bytes"
    assert varstore.open(tmp_path / "large-dataset")[0]["data"] == bytes(LARGE_FILE)


@pytest.mark.skipif(not hasattr(resource, "RLIMIT_AS"), reason="no address-space limit to set")
@pytest.mark.timeout(SUBPROCESS_SAFETY_NET_S + 300)
def test_a_file_larger_than_the_address_space_allows_is_a_one_line_error(tmp_path: Path) -> None:
    source = folder_of_one_file(tmp_path / "huge", 1 << 30)  # 1 GiB, under an address space of 768 MiB
    limit = 768 << 20

    def limit_address_space() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    done = subprocess.run(
        [sys.executable, "-m", "varstore", "convert", str(source), str(tmp_path / "dataset"), "--max-record-bytes", "2G"],
        check=False, capture_output=True, text=True, timeout=SUBPROCESS_SAFETY_NET_S, env=QUIET_ENVIRONMENT,
        preexec_fn=limit_address_space,
    )
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    assert len(done.stderr.splitlines()) == 1, done.stderr
    assert str(source / "file.bin") in done.stderr and "not enough memory" in done.stderr
    assert not (tmp_path / "dataset").exists()


def shard_data(directory: Path) -> bytes:
    """The payload bytes of a dataset's shards, in shard order."""
    return b"".join(Path(f"{shard}.data").read_bytes() for shard in varstore.open(directory).shard_paths)


@pytest.mark.parametrize("labels", [False, True])
def test_folder_records_are_the_bytes_the_msgpack_codec_writes(tmp_path: Path, labels: bool) -> None:
    """Sizes on both sides of msgpack's bin8, bin16 and bin32 widths, and names of its str widths."""
    sizes = [0, 1, 255, 256, 65_535, 65_536, 1 << 20, (1 << 20) + 7, 3 << 20]
    source = tmp_path / "files"
    for number, size in enumerate(sizes):
        folder = source / f"class{number % 2}" if labels else source / ("deep/" * 50 if number == 8 else "")
        folder.mkdir(parents=True, exist_ok=True)
        (folder / (f"{number:02d}-" + "é" * (number * 12))).write_bytes(os.urandom(size))
    convert(source, tmp_path / "converted", labels=labels)
    converted = varstore.open(tmp_path / "converted")
    with varstore.ShardedWriter(tmp_path / "encoded", codec="msgpack") as writer:
        for record in converted:
            writer.append(dict(record))
    assert len(converted) == len(sizes)
    assert shard_data(tmp_path / "converted") == shard_data(tmp_path / "encoded")


@pytest.mark.parametrize("reported", [0, 10, 5000])
def test_a_file_whose_size_changes_while_read_is_recorded_as_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  reported: int) -> None:
    (tmp_path / "files").mkdir()
    content = os.urandom(1000)
    (tmp_path / "files" / "a.bin").write_bytes(content)
    changing = os.stat(tmp_path / "files" / "a.bin").st_ino

    def fstat_of_another_moment(fd: int, real=os.fstat) -> os.stat_result:
        status = real(fd)
        return os.stat_result(status[:6] + (reported,) + status[7:]) if status.st_ino == changing else status

    monkeypatch.setattr(os, "fstat", fstat_of_another_moment)
    convert(tmp_path / "files", tmp_path / "dataset")
    assert list(varstore.open(tmp_path / "dataset")) == [{"name": "a.bin", "data": content}]


def test_a_file_over_what_a_msgpack_bin_holds_is_refused_naming_it(tmp_path: Path) -> None:
    source = folder_of_one_file(tmp_path / "files", 1 << 32)
    with pytest.raises(VarstoreError, match=r"file\.bin: 4,294,967,296 bytes is more than a msgpack bin value holds"):
        convert(source, tmp_path / "dataset", max_record_bytes=1 << 33)

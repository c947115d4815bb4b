"""docs/guarantees.md, "Scale": open time does not depend on the record count, because opening a shard reads the
same bytes (its header, metadata and the data file's edges) whatever the count. Counted at os.pread."""

from __future__ import annotations

import os

import varstore


def _bytes_read_by_open(prefix, monkeypatch) -> int:
    read = 0
    pread = os.pread

    def counting_pread(fd: int, length: int, offset: int) -> bytes:
        nonlocal read
        chunk = pread(fd, length, offset)
        read += len(chunk)
        return chunk

    monkeypatch.setattr(os, "pread", counting_pread)
    try:
        varstore.open(prefix).close()
    finally:
        monkeypatch.setattr(os, "pread", pread)
    return read


def test_opening_a_shard_reads_as_many_bytes_for_a_million_records_as_for_ten_thousand(tmp_path, monkeypatch):
    read = {}
    for count in (10_000, 1_000_000):
        prefix = tmp_path / f"records-{count}"
        with varstore.Writer(prefix) as writer:
            writer.extend_flat(b"x" * (8 * count), [8] * count)
        read[count] = _bytes_read_by_open(prefix, monkeypatch)
    assert read[10_000] == read[1_000_000]
    assert read[1_000_000] < 64 << 10  # the header, the metadata and two 4 KiB edges, not an 8 MB offset array

"""Each line of the writer journal carries the CRC32C of its text: a line whose text no longer matches (an edit, a
flipped byte) is not believed, and neither is anything after it, so a resume never adopts a shard another line
named."""

from __future__ import annotations

from pathlib import Path

import pytest

import varstore
from varstore.local.journal import journal_path, read_journal


def _interrupted_run(directory: Path) -> list[str]:
    """A dataset writer that committed two shards and began a third, then stopped (no manifest); its journal lines."""
    writer = varstore.ShardedWriter(directory, max_shard_records=2)
    writer.extend([b"a", b"b", b"c", b"d", b"e"])
    writer._journal.close()
    writer._lock.release()
    writer._journal = writer._lock = None  # dropped as a killed process drops them: nothing is cleaned up
    return Path(journal_path(str(directory))).read_bytes().decode().splitlines()


@pytest.mark.timeout(60)
def test_a_journal_line_edited_to_name_another_shard_is_not_believed(tmp_path: Path) -> None:
    lines = _interrupted_run(tmp_path)
    assert read_journal(str(tmp_path)).begun == ["shard-000000", "shard-000001", "shard-000002"]
    edited = [line.replace('"begun":"shard-000001"', '"begun":"shard-000007"') for line in lines]
    assert edited != lines  # still valid JSON, the old checksum in front of it
    Path(journal_path(str(tmp_path))).write_text("".join(line + "\n" for line in edited))
    run = read_journal(str(tmp_path))
    assert "shard-000007" not in run.begun
    assert run.begun == ["shard-000000"]  # the edited line and every line after it are ignored


@pytest.mark.timeout(60)
def test_a_journal_whose_first_line_fails_its_checksum_describes_no_run(tmp_path: Path) -> None:
    lines = _interrupted_run(tmp_path)
    lines[0] = lines[0].replace('"replaces":null', '"replaces":7')
    Path(journal_path(str(tmp_path))).write_text("".join(line + "\n" for line in lines))
    assert read_journal(str(tmp_path)) is None

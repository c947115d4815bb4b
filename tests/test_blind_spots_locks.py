"""Writer locks interrupted once taken: the mutant of issue 23 that dropped the release and passed every test."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from varstore.local import locks


class InterruptingSet:
    """Stands for the set of held locks: Ctrl-C lands as a lock, already taken, is added to it."""

    def add(self, lock: locks.WriterLock) -> None:
        raise KeyboardInterrupt

    def discard(self, lock: locks.WriterLock) -> None:
        pass


def test_an_interrupt_right_after_the_lock_is_taken_releases_it_while_the_traceback_lives(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = str(tmp_path / "dataset.varstore-lock")
    monkeypatch.setattr(locks, "_HELD", InterruptingSet())
    with pytest.raises(KeyboardInterrupt) as caught:  # its traceback keeps the half-made lock, as a CLI's handler would
        locks.WriterLock(path, "dataset directory test")
    monkeypatch.undo()
    assert not os.path.exists(path)
    with locks.WriterLock(path, "dataset directory test") as second:  # not refused as a concurrent writer
        assert second.held
    del caught


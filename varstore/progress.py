"""How a long operation (a copy, a verification, a conversion) reports its progress: through a `ProgressBar`, a
callable that is given the total amount of work once it is known (None if unknown) and its unit (``"B"`` for
bytes, or what a conversion counts) and returns a context manager, entered around the work, whose value is then
called with each amount done. ``varstore.cli.output.progress_bar`` with its options bound is one; so is
``lambda total, unit: contextlib.nullcontext(print)``.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, ContextManager, Iterator

Advance = Callable[[int], object]
ProgressBar = Callable[["int | None", str], ContextManager[Advance]]


class Counter:
    """Called with each amount done: counts it in `done` and passes it on to `advance`, if any."""

    def __init__(self, advance: Advance | None = None) -> None:
        self.done = 0
        self._advance = advance

    def __call__(self, amount: int) -> None:
        self.done += amount
        if self._advance is not None:
            self._advance(amount)


@contextmanager
def reporting(progress: ProgressBar | None, total: int | None, unit: str = "B") -> Iterator[Counter]:
    """A `Counter` of the work done inside the block, reported to `progress` (opened with `total` and `unit`) if
    given."""
    if progress is None:
        yield Counter()
        return
    with progress(total, unit) as advance:
        yield Counter(advance)

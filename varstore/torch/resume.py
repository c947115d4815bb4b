"""Checking a saved resume state before trusting its count: a count made under other settings points elsewhere."""

from __future__ import annotations

import operator
from typing import Any

from ..errors import VarstoreError


def as_int(value: Any, what: str) -> int:
    """`value` as a plain int if it is integer-like (numpy integer, 0-d integer tensor, ...), else an error naming `what`.

    States hold plain ints, so `json.dumps` and `load_state_dict` take them whatever the caller counted with.
    """
    if isinstance(value, bool):
        raise VarstoreError(f"{what} must be an integer, not {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise VarstoreError(f"{what} must be an integer, not {type(value).__name__} {value!r}") from None


def check_resume_state(state: Any, settings: dict[str, Any], total: int) -> tuple[int, int]:
    """`(epoch, samples_consumed)` of `state`, once its kind and order-defining `settings` match ours."""
    if not isinstance(state, dict) or state.get("kind") != settings["kind"]:
        kind = state.get("kind") if isinstance(state, dict) else type(state).__name__
        raise VarstoreError(f"{settings['kind']}.load_state_dict got a state of kind {kind!r}")
    differing = [
        f"{key}: saved {state.get(key)!r}, now {value!r}" for key, value in settings.items() if state.get(key) != value
    ]
    if differing:
        raise VarstoreError(f"cannot resume: the saved state was made with other settings ({'; '.join(differing)})")
    epoch, consumed = as_int(state.get("epoch"), "saved epoch"), as_int(state.get("samples_consumed"), "saved samples_consumed")
    if not 0 <= consumed <= total:
        raise VarstoreError(f"saved samples_consumed is {consumed}; it must be in [0, {total}]")
    return epoch, consumed


class EpochPosition:
    """The epoch whose order a sampler or stream follows, and `_start`, the position in it a resume starts from."""

    epoch: int
    _start: int

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch's order; a resume position loaded for another epoch is dropped."""
        epoch = as_int(epoch, "epoch")
        if epoch != self.epoch:
            self.epoch = epoch
            self._start = 0

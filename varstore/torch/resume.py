"""Checking a saved resume state before trusting its count: a count made under other settings points elsewhere."""

from __future__ import annotations

from typing import Any

from ..errors import VarstoreError


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
    epoch, consumed = state.get("epoch"), state.get("samples_consumed")
    if type(epoch) is not int or type(consumed) is not int or not 0 <= consumed <= total:
        raise VarstoreError(
            f"saved epoch {epoch!r} and samples_consumed {consumed!r} must be integers with 0 <= count <= {total}"
        )
    return epoch, consumed

"""The states inside torchdata's ``StatefulDataLoader.state_dict()``, read without torchdata (a plain dict).

A loader's state holds each worker's dataset state (or, without workers, the one dataset state) and the main
process's sampler state; a varstore piece given the whole loader state takes its own from there, so that a run
checkpointed by the loader can resume with another number of workers or ranks, which the loader itself refuses.
"""

from __future__ import annotations

from typing import Any

from ..errors import VarstoreError


def is_loader_state(state: Any) -> bool:
    """Whether `state` is a ``StatefulDataLoader.state_dict()``: with workers (a snapshot) or without."""
    return isinstance(state, dict) and ("_snapshot" in state or "_num_yielded" in state)


def dataset_states(state: dict[str, Any]) -> list[Any]:
    """The dataset state of each worker (worker 0 first), or the one of a loader without workers."""
    if "_snapshot" not in state:
        return [state.get("dataset_state")]
    _refuse_steps_since_snapshot(state)
    workers = state["_snapshot"]["_worker_snapshots"]
    return [workers[key]["dataset_state"] for key in sorted(workers, key=lambda key: int(key.rsplit("_", 1)[1]))]


def sampler_state(state: dict[str, Any]) -> Any:
    """The sampler's state: the one the loader's batch sampler (its iterator) saved for the sampler it wraps."""
    if "_snapshot" in state:
        _refuse_steps_since_snapshot(state)
        state = state["_snapshot"]["_main_snapshot"]
    batches = state.get("_sampler_iter_state")  # the state of the batch sampler's iterator
    if not isinstance(batches, dict) or "sampler_state" not in batches:
        raise VarstoreError("the StatefulDataLoader state holds no sampler state: was its sampler= a varstore sampler?")
    return batches["sampler_state"]


def _refuse_steps_since_snapshot(state: dict[str, Any]) -> None:
    steps = state.get("_steps_since_snapshot", 0)
    if steps:
        raise VarstoreError(
            f"the StatefulDataLoader state was taken {steps} batches after its last snapshot, which only that loader "
            "replays; with snapshot_every_n_steps=1 (its default) the state holds every batch delivered"
        )

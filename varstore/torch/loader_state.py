"""The states inside torchdata's ``StatefulDataLoader.state_dict()``, read without torchdata (a plain dict).

A loader's state holds each worker's dataset state (or, without workers, the one dataset state) and the main
process's sampler state; a varstore piece given the whole loader state takes its own from there, so that a run
checkpointed by the loader can resume with another number of workers or ranks, which the loader itself refuses.
"""

from __future__ import annotations

import re
from typing import Any

from ..errors import VarstoreError


def is_loader_state(state: Any) -> bool:
    """Whether `state` is a ``StatefulDataLoader.state_dict()``: with workers (a snapshot) or without."""
    return isinstance(state, dict) and ("_snapshot" in state or "_num_yielded" in state)


def dataset_states(state: dict[str, Any]) -> list[Any]:
    """The dataset state of each worker (worker 0 first), or the one of a loader without workers."""
    if "_snapshot" not in state:
        return [state.get("dataset_state")]
    workers = _member(_snapshot(state), "_worker_snapshots")
    numbered = {}
    for key, worker in workers.items():
        match = re.fullmatch(r"worker_(\d+)", key) if isinstance(key, str) else None
        if match is None or not isinstance(worker, dict) or "dataset_state" not in worker:
            raise VarstoreError(f"the StatefulDataLoader state's worker snapshot {key!r} is not one torchdata saves "
                                "(worker_N holding a dataset_state)")
        numbered[int(match.group(1))] = worker["dataset_state"]
    return [numbered[number] for number in sorted(numbered)]


def sampler_state(state: dict[str, Any]) -> Any:
    """The sampler's state: the one the loader's batch sampler (its iterator) saved for the sampler it wraps."""
    if "_snapshot" in state:
        state = _member(_snapshot(state), "_main_snapshot")
    batches = state.get("_sampler_iter_state")  # the state of the batch sampler's iterator
    if not isinstance(batches, dict) or "sampler_state" not in batches:
        raise VarstoreError("the StatefulDataLoader state holds no sampler state: was its sampler= a varstore sampler?")
    return batches["sampler_state"]


def _snapshot(state: dict[str, Any]) -> dict[str, Any]:
    """The loader state's last snapshot, refused unless taken at a batch the state holds."""
    _refuse_steps_since_snapshot(state)
    snapshot = state["_snapshot"]
    if not isinstance(snapshot, dict):
        raise VarstoreError(f"the StatefulDataLoader state's _snapshot is {snapshot!r}, not the mapping torchdata saves")
    return snapshot


def _member(snapshot: dict[str, Any], name: str) -> dict[str, Any]:
    member = snapshot.get(name)
    if not isinstance(member, dict):
        raise VarstoreError(f"the StatefulDataLoader state's snapshot holds {name} = {member!r}, not a mapping")
    return member


def _refuse_steps_since_snapshot(state: dict[str, Any]) -> None:
    steps = state.get("_steps_since_snapshot", 0)
    if steps:
        raise VarstoreError(
            f"the StatefulDataLoader state was taken {steps} batches after its last snapshot, which only that loader "
            "replays; with snapshot_every_n_steps=1 (its default) the state holds every batch delivered"
        )

"""The version fingerprint a saved resume state carries, so that it is never loaded on other data.

A count of consumed samples means something only for the data it was counted on: loaded on a dataset that was
rewritten since, it would skip some records and repeat others without a word. States therefore record the
version of what they were made on, and loading checks it.
"""

from __future__ import annotations

from typing import Any

from ..errors import VarstoreError


def dataset_version(data: Any) -> str | None:
    """The version of `data` as a hex string: a varstore reader's (a dataset's is the BLAKE2b-128 of its manifest),
    that of a dataset over one (`RecordDataset`, `TokenWindowDataset`), or a `BlendedDataset`'s own; None for a plain
    size or a dataset varstore knows nothing of (then only its length is checked)."""
    version = getattr(data, "version", None)
    if version is None and hasattr(data, "reader"):
        version = getattr(data.reader, "version", None)
    if version is None:
        source = getattr(data, "_source", None)  # TokenWindowDataset: its process-local reader
        version = getattr(source.get(), "version", None) if hasattr(source, "get") else None
    if isinstance(version, int) and not isinstance(version, bool):
        return format(version, "x")
    return version if isinstance(version, str) else None


def check_version(state: dict[str, Any], version: str | None, kind: str) -> None:
    """Refuse `state` if it records another dataset version than `version`.

    A state saved before versions were recorded (no ``dataset_version`` key) loads: its settings are still checked,
    as is what is no dict at all.
    """
    if not isinstance(state, dict) or "dataset_version" not in state:
        return
    saved = state["dataset_version"]
    if saved != version:
        raise VarstoreError(
            f"cannot resume {kind}: the saved state was made on dataset version {saved}, this is version {version}; "
            "the data changed since the checkpoint, and its count would skip or repeat records"
        )

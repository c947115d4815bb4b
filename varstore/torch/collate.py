"""Collation of variable-length samples: padded to the longest in the batch, or jagged (flat values plus offsets).

Both functions take what a varstore dataset yields: a list of samples (tensors or
numpy arrays whose first dimension varies; dicts of them), or a batch already read
flat with `get_batch_flat`. Padding is one numpy scatter, whatever the batch size.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple, Sequence

import numpy as np
import torch
from torch.utils.data import default_collate

from ..errors import RecordTypeError
from ..reader import FlatBatch

# Tensors whose dtype numpy lacks (bfloat16, float8...) are collated as integers of the same width.
_SAME_WIDTH_INTEGER = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


class PaddedBatch(NamedTuple):
    """`values` is ``(batch, length, *trailing)``; sample k fills ``values[k, :lengths[k]]``, where `mask` is True."""

    values: torch.Tensor
    lengths: torch.Tensor
    mask: torch.Tensor


class JaggedBatch(NamedTuple):
    """Samples back to back: sample k is ``values[offsets[k]:offsets[k + 1]]`` (offsets int64, batch + 1 of them)."""

    values: torch.Tensor
    offsets: torch.Tensor

    @property
    def lengths(self) -> torch.Tensor:
        return self.offsets.diff()

    @property
    def max_length(self) -> int:
        """The longest sample, as varlen attention kernels want it next to the offsets."""
        return int(self.lengths.max()) if len(self.offsets) > 1 else 0

    def to_nested(self) -> torch.Tensor:
        """A ``torch.nested`` tensor in jagged layout viewing the same values."""
        return torch.nested.nested_tensor_from_jagged(self.values, self.offsets)


def writable_tensor(array: np.ndarray) -> torch.Tensor:
    """A tensor of `array`, copied only if it is read-only (a view of a map or of immutable bytes)."""
    return torch.from_numpy(array if array.flags.writeable else array.copy())


def _as_array(sample: Any, position: int) -> tuple[np.ndarray, torch.dtype | None]:
    """A numpy view of one sample, and the torch dtype to restore if numpy could not hold it."""
    if isinstance(sample, np.ndarray):
        array, restore = sample, None
    elif isinstance(sample, torch.Tensor):
        tensor = sample.detach()
        if tensor.device.type != "cpu":
            raise RecordTypeError(f"sample {position} is on {tensor.device}; collation works on CPU tensors")
        try:
            array, restore = tensor.numpy(), None
        except TypeError:
            array, restore = tensor.view(_SAME_WIDTH_INTEGER[tensor.element_size()]).numpy(), tensor.dtype
    else:
        raise RecordTypeError(f"sample {position} is a {type(sample).__name__}; expected a tensor or numpy array")
    if array.ndim == 0:
        raise RecordTypeError(f"sample {position} is a scalar; variable-length collation needs at least one dimension")
    return array, restore


def _flat(samples: Sequence[Any]) -> tuple[np.ndarray, np.ndarray, torch.dtype | None]:
    """(values, lengths, dtype to restore) of a list of samples, checking they agree in dtype and trailing shape."""
    if len(samples) == 0:
        raise RecordTypeError("cannot collate an empty batch")
    converted = [_as_array(sample, position) for position, sample in enumerate(samples)]
    first, restore = converted[0]
    for position, (array, restored) in enumerate(converted):
        if array.dtype != first.dtype or restored != restore or array.shape[1:] != first.shape[1:]:
            raise RecordTypeError(
                f"sample {position} has dtype {restored or array.dtype} and shape {array.shape}, but sample 0 has "
                f"dtype {restore or first.dtype} and shape {first.shape}: only the first dimension may vary"
            )
    lengths = np.array([array.shape[0] for array, _ in converted], np.int64)
    return np.concatenate([array for array, _ in converted]), lengths, restore


def _flat_batch(batch: Any) -> tuple[np.ndarray, np.ndarray, torch.dtype | None] | None:
    """(values, lengths, dtype to restore) if `batch` was read flat already, else None."""
    if isinstance(batch, FlatBatch):
        return batch.values, np.diff(batch.offsets), None
    if isinstance(batch, JaggedBatch):
        values, restore = _as_array(batch.values, 0)
        return values, batch.lengths.numpy(), restore
    return None


def _to_tensor(array: np.ndarray, restore: torch.dtype | None) -> torch.Tensor:
    tensor = writable_tensor(array)
    return tensor if restore is None else tensor.view(restore)


def _fill_value(pad_value: Any, dtype: np.dtype, restore: torch.dtype | None) -> Any:
    """`pad_value` in the stored dtype, or an error if that dtype cannot hold it exactly."""
    if restore is not None:
        return torch.tensor(pad_value, dtype=restore).view(_SAME_WIDTH_INTEGER[restore.itemsize]).item()
    try:
        converted = np.array(pad_value, dtype=dtype)
    except (OverflowError, ValueError, TypeError) as error:
        raise RecordTypeError(f"pad value {pad_value!r} does not fit dtype {dtype}: {error}") from None
    if not (converted == pad_value or (converted != converted and pad_value != pad_value)):
        raise RecordTypeError(f"pad value {pad_value!r} would become {converted.item()!r} in dtype {dtype}")
    return converted


def _is_sequence_field(value: Any) -> bool:
    return isinstance(value, (np.ndarray, torch.Tensor)) and value.ndim >= 1


def _by_field(batch: Sequence[dict[str, Any]], collate_sequences: Any) -> dict[str, Any]:
    """Dict samples: array fields collated by `collate_sequences`, the rest (labels, scalars, text) by `default_collate`."""
    keys = batch[0].keys()
    for position, sample in enumerate(batch):
        if sample.keys() != keys:
            raise RecordTypeError(f"sample {position} has fields {sorted(sample)}, sample 0 has {sorted(keys)}")
    return {
        key: collate_sequences([sample[key] for sample in batch])
        if _is_sequence_field(batch[0][key])
        else default_collate([sample[key] for sample in batch])
        for key in keys
    }


def collate_padded(batch: Any, pad_value: Any = 0, pad_to_multiple: int = 1) -> PaddedBatch | dict[str, Any]:
    """Pad samples to the longest one (rounded up to `pad_to_multiple`) with `pad_value`.

    Use as ``collate_fn=functools.partial(collate_padded, pad_value=-100)``. Dict
    samples give a dict: a `PaddedBatch` per array field, `default_collate` for the rest.
    """
    if pad_to_multiple < 1:
        raise RecordTypeError(f"pad_to_multiple must be at least 1, not {pad_to_multiple}")
    flat = _flat_batch(batch)
    if flat is None:
        if len(batch) and isinstance(batch[0], dict):
            return _by_field(batch, lambda field: collate_padded(field, pad_value, pad_to_multiple))
        flat = _flat(batch)
    values, lengths, restore = flat
    longest = int(lengths.max()) if len(lengths) else 0
    width = math.ceil(longest / pad_to_multiple) * pad_to_multiple
    padded = np.full((len(lengths), width, *values.shape[1:]), _fill_value(pad_value, values.dtype, restore), values.dtype)
    mask = np.arange(width) < lengths[:, None]
    padded[mask] = values
    return PaddedBatch(_to_tensor(padded, restore), torch.from_numpy(lengths.astype(np.int64)), torch.from_numpy(mask))


def collate_jagged(batch: Any) -> JaggedBatch | dict[str, Any]:
    """Concatenate samples into one values tensor plus int64 offsets (a flat batch passes through as tensors).

    Dict samples give a dict: a `JaggedBatch` per array field, `default_collate` for the rest.
    """
    if isinstance(batch, JaggedBatch):
        return batch
    flat = _flat_batch(batch)
    if flat is None:
        if len(batch) and isinstance(batch[0], dict):
            return _by_field(batch, collate_jagged)
        flat = _flat(batch)
    values, lengths, restore = flat
    offsets = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return JaggedBatch(_to_tensor(values, restore), torch.from_numpy(offsets))

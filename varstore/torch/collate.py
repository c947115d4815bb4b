"""Collation of variable-length samples: padded to the longest in the batch, or jagged (flat values plus offsets).

Both functions take what a varstore dataset yields: a list of samples (tensors or
numpy arrays whose first dimension varies; dicts of them), or a batch already read
flat with `get_batch_flat`. Padding is one numpy scatter, whatever the batch size.

Where stored data becomes tensors, integers become int64 (`tensor_dtype`), the
dtype embeddings and losses take: in the datasets for ``output="torch"``, and here
for numpy input (``output="numpy"``); tensors keep their dtype. ``keep_dtype=True``
keeps the stored dtype instead, for memory. Floats and bools always keep theirs.
"""

from __future__ import annotations

import itertools
import math
import operator
from multiprocessing.reduction import ForkingPickler
from typing import Any, Callable, NamedTuple, Sequence

import numpy as np
import torch
from torch.utils.data import default_collate

from ..errors import RecordTypeError, VarstoreError
from ..shard.reader import FlatBatch

_REQUIRES_GRAD = operator.attrgetter("requires_grad")
# Tensors whose dtype numpy lacks (bfloat16, float8...) are collated as integers of the same width.
_SAME_WIDTH_INTEGER = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_INT64_BOUND = np.uint64(2**63)
# A batch buffer of up to this many bytes crosses from a DataLoader worker inside the pickle (a copy through the
# queue's pipe) rather than in a shared-memory segment, whose creation, descriptor passing and mapping cost more
# below a few MiB: 1.8 against 4.2 ms a batch of 0.6 MB, 19 against 15 at 4 MB (tests' machine, 2 workers).
INLINE_HANDOFF_BYTES = 1 << 20


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


def tensor_dtype(dtype: np.dtype, keep_dtype: bool) -> np.dtype:
    """The dtype stored `dtype` takes as a tensor: integers become int64 unless `keep_dtype` (uint64 only where every
    value fits: see `_check_fits_int64`); floats and bools keep theirs."""
    if keep_dtype or dtype.kind not in "iu":
        return dtype
    return np.dtype(np.int64)


def _check_fits_int64(array: np.ndarray, where: Callable[[int], str], path: str | None = None) -> None:
    """Refuse uint64 `array` if it holds a value of 2**63 or more, which int64 cannot hold (one vectorised max);
    `where(i)` names the record (and field) of flat element i for the message."""
    if array.size == 0 or array.max() < _INT64_BOUND:
        return
    flat = array.reshape(-1)
    position = int(np.argmax(flat >= _INT64_BOUND))
    raise RecordTypeError(
        f"{where(position)} holds uint64 value {int(flat[position])}, which int64 tensors cannot hold "
        "(2**63 or more): pass keep_dtype=True for tensors in the stored dtypes",
        path=path,
    )


def stored_tensor(array: np.ndarray, keep_dtype: bool, where: Callable[[int], str], path: str | None) -> torch.Tensor:
    """A tensor of stored `array` in its `tensor_dtype`, never sharing memory with a read-only array (one copy at most)."""
    return torch.from_numpy(_writable_stored(array, keep_dtype, where, path))


def _writable_stored(array: np.ndarray, keep_dtype: bool, where: Callable[[int], str], path: str | None) -> np.ndarray:
    """`array` in its `tensor_dtype`, writable: itself if it already is, else one copy."""
    dtype = tensor_dtype(array.dtype, keep_dtype)
    if dtype != array.dtype and array.dtype == np.uint64:  # values that fit int64 have the same bits in it
        _check_fits_int64(array, where, path)
        array = array.view(np.int64)
    elif dtype != array.dtype:
        return array.astype(dtype)
    return array if array.flags.writeable else array.copy()


class SampleBatch(list):
    """The samples of one batch (a list, as collate functions take it) that are consecutive pieces of one buffer,
    `values`: `collate_jagged` and `collate_padded` take that buffer as the batch instead of joining the samples
    again, as long as the list is unchanged (`flat`).

    Handed to another process by `multiprocessing` (a DataLoader worker's queue) it travels as that buffer (inline
    up to `INLINE_HANDOFF_BYTES`, else one tensor whose storage torch shares: one shared-memory segment, not one
    per sample) and its lengths, and is cut again there: each sample is a tensor of its own storage over its
    piece of the received buffer, as in the process that read it (writable; changed in place, it changes no
    other sample; saved, it saves only its piece; the buffer lives as long as any of its samples). A list
    changed since it was cut travels as a plain list of its tensors, as pickle and `torch.save` always take it."""

    def __init__(self, samples: list[torch.Tensor], values: np.ndarray, lengths: np.ndarray) -> None:
        super().__init__(samples)
        self._samples = samples
        self.values, self.lengths = values, lengths

    def flat(self) -> _Flat | None:
        """The samples back to back as the buffer they were cut from (so the collated values share its memory with
        the samples: in place, a change to one shows in the other), or None if the list was changed since."""
        if len(self) != len(self._samples) or not all(map(operator.is_, self, self._samples)):
            return None
        return _Flat(self.values, self.lengths, None, self.values.dtype)

    def _intact(self) -> bool:
        """Whether the buffer alone can stand for the list: `flat`'s condition, and every sample still views its
        piece of `values` as cut (same memory, shape, strides, dtype and class: no in-place ``unsqueeze_``,
        ``set_``, ``share_memory_``, ``.data`` view or ``__class__`` since) and asks for no gradient. Checked at once
        for the whole batch, only when sent."""
        if self.flat() is None or any(map(_REQUIRES_GRAD, self)):
            return False
        values, tensor = self.values, torch.Tensor
        if {(type(sample), sample.dtype) for sample in self} != {(tensor, torch.from_numpy(values[:0]).dtype)}:
            return False
        trailing = values.shape[1:]
        if list(map(tensor.size, self)) != [(length, *trailing) for length in self.lengths.tolist()]:
            return False
        strides = tuple(stride // values.itemsize for stride in values.strides)
        if list(map(tensor.stride, self)) != [strides] * len(self):
            return False
        row_bytes = values.itemsize * math.prod(trailing)
        starts = np.concatenate(([0], np.cumsum(self.lengths[:-1]))) * row_bytes + values.ctypes.data
        filled = self.lengths * row_bytes > 0  # an empty tensor's pointer says nothing (torch makes it null)
        pointers = np.array(list(map(tensor.data_ptr, self)), np.uint64)
        return bool(np.array_equal(pointers[filled], starts[filled].astype(np.uint64)))

    def __copy__(self) -> SampleBatch:
        """A shallow copy, still of the same buffer: DataLoader's `default_convert`, which ``batch_size=None``
        applies to every batch a `RecordStream` yields, copies lists this way before a worker sends them."""
        copy = SampleBatch(self._samples, self.values, self.lengths)
        copy[:] = self
        return copy

    def pin_memory(self) -> list[torch.Tensor]:
        """The samples pinned, as the plain list torch's `pin_memory` makes of a list (the buffer stays unpinned)."""
        return [sample.pin_memory() for sample in self]

    def __reduce__(self) -> tuple[type, tuple[list[torch.Tensor]]]:
        return list, (list(self),)


def _cut(values: np.ndarray, lengths: np.ndarray) -> SampleBatch:
    """`values` cut into samples of `lengths` rows, each a tensor of its own storage over its piece."""
    bounds = [0, *itertools.accumulate(lengths.tolist())]
    from_numpy = torch.from_numpy
    return SampleBatch([from_numpy(values[start:end]) for start, end in zip(bounds, bounds[1:])], values, lengths)


def _handed_over(batch: SampleBatch) -> tuple[Callable[..., list[torch.Tensor]], tuple]:
    """How `multiprocessing` sends a `SampleBatch`: its buffer and its lengths, to be cut again by `_received`; a
    changed list as the plain list of its tensors. A buffer of up to `INLINE_HANDOFF_BYTES` goes inline, in the
    pickle itself; a larger one as one tensor whose storage torch shares."""
    if not batch._intact():
        return list, (list(batch),)
    values, lengths = batch.values, batch.lengths.tolist()
    if values.nbytes <= INLINE_HANDOFF_BYTES:
        inline = bytearray(np.ascontiguousarray(values).data)
        return _received_inline, (inline, values.dtype, values.shape[1:], lengths)
    return _received, (torch.from_numpy(values), lengths)


def _received(values: torch.Tensor, lengths: list[int]) -> SampleBatch:
    """A `SampleBatch` sent by `_handed_over`, cut again from the buffer torch shared."""
    return _cut(values.numpy(), np.array(lengths, np.int64))


def _received_inline(buffer: bytearray, dtype: np.dtype, trailing: tuple[int, ...], lengths: list[int]) -> SampleBatch:
    """A `SampleBatch` sent inline by `_handed_over`, cut again from the bytes that came in the pickle."""
    values = np.frombuffer(buffer, dtype).reshape((sum(lengths), *trailing))
    return _cut(values, np.array(lengths, np.int64))


ForkingPickler.register(SampleBatch, _handed_over)


def stored_tensor_batch(
    arrays: Sequence[np.ndarray], keep_dtype: bool, name: Callable[[int], str], path: str | None
) -> SampleBatch:
    """`stored_tensor` of each of `arrays` (records of one ndarray dataset: one dtype and trailing shape) with one
    copy for the whole batch, converting on the way. Each tensor has its own storage over its part of that buffer,
    so saving one saves only it, and changing one in place is no autograd change to another. `name(k)` names
    record k in errors."""
    lengths = np.array([len(array) for array in arrays], np.int64)
    dtype = tensor_dtype(arrays[0].dtype, keep_dtype)
    if dtype != arrays[0].dtype and arrays[0].dtype != np.uint64:
        values = np.concatenate(arrays, dtype=dtype)
    else:
        offsets = np.zeros(len(lengths) + 1, np.int64)
        np.cumsum(lengths, out=offsets[1:])
        joined = np.concatenate(arrays)
        values = _writable_stored(joined, keep_dtype, naming_records(joined, offsets, name), path)
    return _cut(values, lengths)


def stored_tensors(value: Any, keep_dtype: bool, record: str, path: str | None, field: tuple = ()) -> Any:
    """Arrays become tensors (copied: the map is read-only; integers as int64 unless `keep_dtype`); dicts and lists
    are converted inside, without recursion (records nest up to 512 levels); the rest is kept. `record`, `path` and
    `field` (where `value` sits in its sample) name the value in errors."""
    if isinstance(value, np.ndarray):
        return stored_tensor(value, keep_dtype, lambda _: _in_field(record, field), path)
    if not isinstance(value, (dict, list)):
        return value
    converted: dict | list = {} if isinstance(value, dict) else [None] * len(value)
    pending: list[tuple[Any, Any, tuple]] = [(value, converted, field)]
    while pending:
        source, target, field = pending.pop()
        for key, item in source.items() if isinstance(source, dict) else enumerate(source):
            if isinstance(item, np.ndarray):
                item = stored_tensor(item, keep_dtype, lambda _, name=(*field, key): _in_field(record, name), path)
            elif isinstance(item, (dict, list)):
                container: dict | list = {} if isinstance(item, dict) else [None] * len(item)
                pending.append((item, container, (*field, key)))
                item = container
            target[key] = item
    return converted


def _in_field(sample: str, field: tuple) -> str:
    """`sample`, and the dotted path of `field` in it if any (list positions as numbers)."""
    return f"{sample}, field {'.'.join(map(str, field))}" if field else sample


def _as_array(sample: Any, name: str) -> tuple[np.ndarray, torch.dtype | None]:
    """A numpy view of one sample (`name` in errors), and the torch dtype to restore if numpy could not hold it."""
    if isinstance(sample, np.ndarray):
        array, restore = sample, None
    elif isinstance(sample, torch.Tensor):
        tensor = sample.detach().resolve_conj().resolve_neg()  # numpy cannot view a lazily conjugated or negated tensor
        if tensor.device.type != "cpu":
            raise RecordTypeError(f"{name} is on {tensor.device}; collation works on CPU tensors")
        try:
            array, restore = tensor.numpy(), None
        except TypeError:
            array, restore = tensor.view(_SAME_WIDTH_INTEGER[tensor.element_size()]).numpy(), tensor.dtype
    else:
        raise RecordTypeError(f"{name} is a {type(sample).__name__}; expected a tensor or numpy array")
    if array.ndim == 0:
        raise RecordTypeError(f"{name} is a scalar; variable-length collation needs at least one dimension")
    return array, restore


class _Flat(NamedTuple):
    """Samples back to back, before they become tensors."""

    values: np.ndarray  # in the samples' dtype, maybe a read-only view
    lengths: np.ndarray
    restore: torch.dtype | None  # the torch dtype numpy could not hold, to view the result as
    dtype: np.dtype  # of the tensor to make: `tensor_dtype` for numpy samples, the samples' own for tensors


def naming_records(values: np.ndarray, offsets: np.ndarray, name: Callable[[int], str]) -> Callable[[int], str]:
    """A `where` for `_check_fits_int64` on records back to back (record k is rows ``offsets[k]:offsets[k + 1]`` of
    `values`): the `name` of the record holding flat element i."""
    row_size = max(1, math.prod(values.shape[1:]))
    return lambda element: name(int(np.searchsorted(offsets, element // row_size, side="right")) - 1)


def _checked(flat: _Flat, name: Callable[[int], str]) -> _Flat:
    """`flat`, after refusing uint64 values that its int64 `dtype` cannot hold (`name(k)` names sample k); uint64
    values that fit are viewed as int64, the same bits, without a copy."""
    if flat.values.dtype != np.uint64 or flat.dtype != np.int64:
        return flat
    offsets = np.concatenate(([0], np.cumsum(flat.lengths)))
    _check_fits_int64(flat.values, naming_records(flat.values, offsets, name))
    return flat._replace(values=flat.values.view(np.int64))


def _flat(samples: Sequence[Any], keep_dtype: bool, field: tuple) -> _Flat:
    """A list of samples (the values of `field` in dict samples) back to back (one copy), checking they agree in
    dtype and trailing shape."""
    if len(samples) == 0:
        raise RecordTypeError("cannot collate an empty batch")
    if isinstance(samples, SampleBatch) and (flat := samples.flat()) is not None:
        return flat
    if isinstance(samples[0], torch.Tensor) and (flat := _flat_tensors(samples)) is not None:
        return flat
    converted = [_as_array(sample, _in_field(f"sample {position}", field)) for position, sample in enumerate(samples)]
    first, restore = converted[0]
    for position, (array, restored) in enumerate(converted):
        if array.dtype != first.dtype or restored != restore or array.shape[1:] != first.shape[1:]:
            raise RecordTypeError(
                f"{_in_field(f'sample {position}', field)} has dtype {restored or array.dtype} and shape "
                f"{array.shape}, but sample 0 has dtype {restore or first.dtype} and shape {first.shape}: "
                "only the first dimension may vary"
            )
    lengths = np.array([array.shape[0] for array, _ in converted], np.int64)
    dtype = tensor_dtype(first.dtype, keep_dtype) if isinstance(samples[0], np.ndarray) else first.dtype
    flat = _Flat(np.concatenate([array for array, _ in converted]), lengths, restore, dtype)
    return _checked(flat, lambda position: _in_field(f"sample {position}", field))


def _flat_tensors(samples: Sequence[Any]) -> _Flat | None:
    """Strided CPU tensors that agree in dtype and trailing shape, back to back with one ``torch.cat`` (tensors keep their
    dtype); None if any does not, for `_flat` to name it."""
    first = samples[0]
    dtype, trailing = first.dtype, first.shape[1:]
    lengths = []
    for sample in samples:
        if sample.__class__ is not torch.Tensor:
            return None
        shape = sample.shape
        if (sample.dtype != dtype or not shape or shape[1:] != trailing or not sample.is_cpu
                or sample.layout != torch.strided):
            return None
        lengths.append(shape[0])
    values, restore = _as_array(torch.cat(samples), "the values")
    return _Flat(values, np.array(lengths, np.int64), restore, values.dtype)


def _flat_batch(batch: Any, keep_dtype: bool) -> _Flat | None:
    """`batch` as a `_Flat` if it was read flat already, else None."""
    if isinstance(batch, FlatBatch):
        flat = _Flat(batch.values, np.diff(batch.offsets), None, tensor_dtype(batch.values.dtype, keep_dtype))
        return _checked(flat, lambda position: f"sample {position}")
    if isinstance(batch, JaggedBatch):
        values, restore = _as_array(batch.values, "the values")
        return _Flat(values, batch.lengths.numpy(), restore, values.dtype)
    return None


def _to_tensor(array: np.ndarray, restore: torch.dtype | None) -> torch.Tensor:
    """A tensor of `array` (which is never converted when `restore` is set), copied only if `array` is read-only."""
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


def _is_sequence(value: Any) -> bool:
    return isinstance(value, (np.ndarray, torch.Tensor)) and value.ndim >= 1


def _collate(batch: Any, collate_flat: Callable[[_Flat], Any], keep_dtype: bool, field: tuple = ()) -> Any:
    """One recursive walk over dict samples: arrays at any depth of dicts become `collate_flat` of their values back
    to back, the rest (labels, scalars, text, lists) `default_collate` of `stored_tensors` copies."""
    flat = _flat_batch(batch, keep_dtype) if not field else None
    if flat is not None:
        return collate_flat(flat)
    if len(batch) and isinstance(batch[0], dict):
        keys = batch[0].keys()
        for position, sample in enumerate(batch):
            if not isinstance(sample, dict) or sample.keys() != keys:
                found = sorted(sample) if isinstance(sample, dict) else f"a {type(sample).__name__}"
                raise RecordTypeError(
                    f"{_in_field(f'sample {position}', field)} has fields {found}, but sample 0 has {sorted(keys)}"
                )
        collated = {}
        for key in keys:  # a loop, not a comprehension: one frame per level of records nested 512 deep
            collated[key] = _collate([sample[key] for sample in batch], collate_flat, keep_dtype, (*field, key))
        return collated
    if not field or _is_sequence(batch[0]):
        return collate_flat(_flat(batch, keep_dtype, field))
    return default_collate(
        [stored_tensors(sample, keep_dtype, f"sample {position}", None, field) for position, sample in enumerate(batch)]
    )


def collate_padded(
    batch: Any, pad_value: Any = 0, pad_to_multiple: int = 1, *, keep_dtype: bool = False
) -> PaddedBatch | dict[str, Any]:
    """Pad samples to the longest one (rounded up to `pad_to_multiple`) with `pad_value`.

    Use as ``collate_fn=functools.partial(collate_padded, pad_value=-100)``. Dict
    samples give a dict of the same shape: a `PaddedBatch` per array field, at any
    depth of nested dicts, and `default_collate` for the rest. Integer numpy samples
    give int64 values unless `keep_dtype`; tensors keep their dtype.
    """
    if pad_to_multiple < 1:
        raise VarstoreError(f"pad_to_multiple must be at least 1, not {pad_to_multiple}")

    def pad(flat: _Flat) -> PaddedBatch:
        values, lengths, restore, dtype = flat
        longest = int(lengths.max()) if len(lengths) else 0
        width = math.ceil(longest / pad_to_multiple) * pad_to_multiple
        padded = np.full((len(lengths), width, *values.shape[1:]), _fill_value(pad_value, dtype, restore), dtype)
        mask = np.arange(width) < lengths[:, None]
        padded[mask] = values  # the one copy, converting to `dtype` on the way
        return PaddedBatch(_to_tensor(padded, restore), torch.from_numpy(lengths.astype(np.int64)), torch.from_numpy(mask))

    return _collate(batch, pad, keep_dtype)


def collate_jagged(batch: Any, *, keep_dtype: bool = False) -> JaggedBatch | dict[str, Any]:
    """Concatenate samples into one values tensor plus int64 offsets (a flat batch passes through as tensors).

    Dict samples give a dict of the same shape: a `JaggedBatch` per array field, at
    any depth of nested dicts, and `default_collate` for the rest. Integer numpy
    samples give int64 values unless `keep_dtype`; tensors keep their dtype.
    """
    if isinstance(batch, JaggedBatch):
        return batch

    def jag(flat: _Flat) -> JaggedBatch:
        values, lengths, restore, dtype = flat
        offsets = np.zeros(len(lengths) + 1, np.int64)
        np.cumsum(lengths, out=offsets[1:])
        return JaggedBatch(_to_tensor(values.astype(dtype, copy=False), restore), torch.from_numpy(offsets))

    return _collate(batch, jag, keep_dtype)

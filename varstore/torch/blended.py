"""`BlendedDataset`: several map-style sources mixed by weight, sample by sample, in O(1) memory at any length.

Sample k is a pure function of (k, seed, weights, source names and lengths):

1. **Which source.** Within a segment of constant weights, the sources with a
   positive weight are the leaves of a balanced binary tree (sorted by name). A
   node whose left subtree holds a fraction p of its weight sends the first m
   samples that reach it left ``floor(p m + 1/2)`` times (Bresenham's rule), so
   each level is off by at most 1/2 sample and a source of a tree of height h by at
   most h/2. Fractions are exact (weights become `fractions.Fraction`), so no float
   rounding can break the bound. Finding sample k's source walks one root-to-leaf
   path: O(log #sources) integer operations, plus a binary search over segments.
2. **Which use of that source.** The counts of each source at every segment start
   are computed once at construction (O(#segments x #sources)), so the j-th use of
   a source is its count before the segment plus its count inside it: a schedule
   change carries every source's position across, and none is repeated or skipped.
3. **Which record.** Use j of a source of n records is position ``p = j % n`` of
   epoch ``e = j // n``, and its record is ``P((a_e p + b_e) % n)``: P is a keyed
   permutation of ``range(n)`` (a Feistel network, see `permutation`) chosen by
   (seed, source name), and ``a_e`` (coprime to n), ``b_e`` are drawn from a hash of
   (seed, source name, e). Both maps are bijections, so every record comes once per
   epoch, in a new order each epoch, with no array per sample or per record; and a
   batch costs one vectorised P call per source, however many epochs it spans.

Megatron's blend builds two per-sample index arrays (10 bytes a sample, so 10 TB
at 10**12 samples) and caches them on disk; here nothing grows with the length.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import json
import math
import operator
import os
import sys
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from numbers import Rational, Real
from typing import Any, Mapping, Sequence, Union

import numpy as np
from torch.utils.data import Dataset

from ..errors import RecordIndexError, VarstoreError
from .datasets import RecordDataset
from .fingerprint import check_version, dataset_version
from .permutation import Permutation, derive_key
from .resume import as_int

_BLEND_PURPOSE = 4
# The most bits a weight's exact numerator or denominator may have: room for any float or long double (the smallest
# IEEE quad is 2**-16494), while an absurd weight is refused before arithmetic on it could run for minutes.
_MAX_WEIGHT_BITS = 16_512
# The largest power of ten a Decimal weight's exact numerator or denominator may reach (10**4970 < 2**16512), judged
# from its digits and exponent: converting it is what costs (Decimal("1e-99999999") is a fraction over 10**99999999).
_MAX_DECIMAL_SCALE = math.floor(_MAX_WEIGHT_BITS * math.log10(2))

Weights = Mapping[str, Union[int, float, Fraction, Decimal]]
Schedule = Sequence[tuple[int, Weights]]


@dataclass(frozen=True)
class SourceProgress:
    """How far a blend prefix went through one source: `samples` taken, the `epoch` it stands in, and the
    `position` within that epoch (``samples == epoch * records + position``)."""

    samples: int
    epoch: int
    position: int


class _Split:
    """A node of a segment's tree: `left` gets ``floor(p m + 1/2)`` of the first m samples, with p = left_weight / weight."""

    __slots__ = ("numerator", "denominator", "left", "right")

    def __init__(self, left_weight: int, weight: int, left: _Split | int, right: _Split | int) -> None:
        common = math.gcd(left_weight, weight)
        self.numerator, self.denominator = left_weight // common, weight // common
        self.left, self.right = left, right

    def left_count(self, samples: int) -> int:
        """How many of the first `samples` samples reaching this node go left (exact integer arithmetic)."""
        return (2 * self.numerator * samples + self.denominator) // (2 * self.denominator)


def _tree(sources: list[tuple[int, Fraction]]) -> _Split | int:
    """The balanced tree over (source number, weight) pairs; a leaf is a source number.

    The weights are put over their common denominator first, so each node's share comes from integer prefix sums
    (Fraction sums at every node made a schedule of 1,000 segments over 100 sources four times slower to build).
    """
    denominator = math.lcm(*(weight.denominator for _, weight in sources))
    prefix = list(itertools.accumulate((weight.numerator * (denominator // weight.denominator) for _, weight in sources),
                                       initial=0))

    def subtree(first: int, stop: int) -> _Split | int:
        if stop - first == 1:
            return sources[first][0]
        middle = first + (stop - first) // 2
        return _Split(prefix[middle] - prefix[first], prefix[stop] - prefix[first], subtree(first, middle), subtree(middle, stop))

    return subtree(0, len(sources))


def _height(node: _Split | int) -> int:
    return 0 if isinstance(node, int) else 1 + max(_height(node.left), _height(node.right))


class _Segment:
    """Samples ``[start, ...)`` mixed by one set of weights, starting from every source's count before it."""

    def __init__(self, start: int, weights: dict[int, Fraction], counts_before: list[int]) -> None:
        self.start = start
        self.root = _tree(sorted(weights.items()))
        self.height = _height(self.root)
        self.counts_before = counts_before

    def locate(self, local: int) -> tuple[int, int]:
        """(source number, use number of that source) of the segment's sample `local`: one root-to-leaf walk."""
        node = self.root
        while not isinstance(node, int):
            went_left = node.left_count(local)
            if node.left_count(local + 1) > went_left:
                node, local = node.left, went_left
            else:
                node, local = node.right, local - went_left
        return node, self.counts_before[node] + local

    def counts_after(self, local: int) -> list[int]:
        """Every source's count once the segment's first `local` samples are taken."""
        counts = list(self.counts_before)
        pending: list[tuple[_Split | int, int]] = [(self.root, local)]
        while pending:
            node, samples = pending.pop()
            if isinstance(node, int):
                counts[node] += samples
            else:
                went_left = node.left_count(samples)
                pending += [(node.left, went_left), (node.right, samples - went_left)]
        return counts


def _name_key(name: str) -> int:
    """A stable 64-bit number for a source name: the same in every process, unlike `hash`."""
    # surrogatepass: a name from os.listdir of an undecodable file name holds lone surrogates; other names encode as UTF-8.
    return int.from_bytes(hashlib.blake2b(name.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "little")


def _epoch_map(length: int, seed: int, name_key: int, epoch: int) -> tuple[int, int]:
    """(a, b) with ``gcd(a, length) == 1``, so ``p -> (a p + b) % length`` is the epoch's own bijection of ``range(length)``."""
    digest = hashlib.blake2b(f"{seed}:{name_key}:{epoch}".encode(), digest_size=16).digest()
    a, b = int.from_bytes(digest[:8], "little") % length, int.from_bytes(digest[8:], "little") % length
    while math.gcd(a, length) != 1:  # a few steps: numbers coprime to length are dense enough
        a = (a + 1) % length
    return a, b


def _exact_weight(name: str, weight: Any, segment_start: int) -> Fraction:
    """`weight` as an exact fraction (the exact value of a float, numpy float, long double or `Decimal`), so no
    rounding can break the proportion bound; refused if its numerator or denominator has over `_MAX_WEIGHT_BITS` bits
    (a `Decimal` by its digits and exponent, before the conversion, which is what costs)."""
    where = f"the weight of source {name!r} (segment at {segment_start})"
    if isinstance(weight, (bool, np.bool_)) or not isinstance(weight, (Real, Decimal)):
        raise VarstoreError(f"{where} must be a number, not {weight!r}")
    if isinstance(weight, Decimal) and weight.is_finite():
        _, digits, exponent = weight.as_tuple()
        # The numerator is below 10**(digits + exponent) for a positive exponent, the denominator at most 10**-exponent.
        scale = max(len(digits) + max(int(exponent), 0), -int(exponent))
        if scale > _MAX_DECIMAL_SCALE:
            shown = repr(weight) if len(digits) <= 40 else f"a Decimal of {len(digits):,} digits"
            raise VarstoreError(
                f"{where} is {shown}, an exact fraction with a numerator or denominator near 10**{scale}; a weight's "
                f"may reach 10**{_MAX_DECIMAL_SCALE} ({_MAX_WEIGHT_BITS:,} bits; any float fits): round it"
            )
    if isinstance(weight, Rational):
        exact = Fraction(int(weight)) if isinstance(weight, np.integer) else Fraction(weight)
    else:
        try:
            ratio = weight.as_integer_ratio() if hasattr(weight, "as_integer_ratio") else float(weight).as_integer_ratio()
        except (OverflowError, ValueError):  # infinities and NaNs have no ratio
            raise VarstoreError(f"{where} must be finite, not {weight!r}") from None
        exact = Fraction(*ratio)
    if exact < 0:
        raise VarstoreError(f"{where} must be >= 0, not {weight!r}")
    bits = max(exact.numerator.bit_length(), exact.denominator.bit_length())
    if bits > _MAX_WEIGHT_BITS:
        raise VarstoreError(
            f"{where}, a {type(weight).__name__}, is an exact fraction with a {bits:,}-bit numerator or denominator; "
            f"a weight may have at most {_MAX_WEIGHT_BITS:,} bits (any float fits): round it"
        )
    return exact


def _spelled_weight(word: str) -> Decimal | Fraction:
    """A data path's weight, exactly: a decimal (``0.3``, ``1e-5``) as a `Decimal`, whose cost `_exact_weight` bounds
    before converting it (a `Fraction` of ``1e-99999999`` would be computed first), or a ratio (``3/10``)."""
    try:
        return Decimal(word)
    except InvalidOperation:
        return Fraction(word)  # ValueError if it is no number


def _as_schedule(weights: Weights | Schedule) -> list[tuple[int, Weights]]:
    if isinstance(weights, Mapping):
        return [(0, weights)]
    if not isinstance(weights, Sequence) or not weights:
        raise VarstoreError(f"weights must be a dict name -> weight or a non-empty list of (start_sample, dict), not {weights!r}")
    for entry in weights:
        if not (isinstance(entry, (tuple, list)) and len(entry) == 2 and isinstance(entry[1], Mapping)):
            raise VarstoreError(f"each schedule entry must be a (start_sample, {{name: weight}}) pair, not {entry!r}")
    return [(as_int(start, "a schedule's start_sample"), segment) for start, segment in weights]


def _check_starts(starts: list[int], num_samples: int) -> None:
    if starts[0] != 0:
        raise VarstoreError(f"a schedule's first segment must start at sample 0, not {starts[0]}")
    for before, after in zip(starts, starts[1:]):
        if after <= before:
            raise VarstoreError(f"schedule segments must start at increasing samples; {after} follows {before}")
    if starts[-1] >= num_samples:
        raise VarstoreError(f"a schedule segment starts at sample {starts[-1]}, but the blend has only {num_samples} samples")


class BlendedDataset(Dataset):
    """Samples mixed from named `sources` by `weights` (a dict, or a schedule of ``(start_sample, dict)``), sample k
    a deterministic function of (k, seed, weights), so any process, worker or rank computes the same blend.

    `sources` maps names to map-style datasets (`RecordDataset`, `TokenWindowDataset`,
    anything with ``__len__``/``__getitem__``) or to paths, opened as `RecordDataset`.
    Weights need not sum to 1; a source absent from a segment has weight 0 there, so
    adding a source at a checkpoint is a schedule entry.

    Guarantees: in a segment of constant weights with s sources of positive weight,
    after any m samples of the segment each source's count in it is within
    ``ceil(log2 s) / 2`` of ``weight x m`` (1/2 for two sources, 1 for up to four;
    `proportion_bound`); over a schedule the deviations of the segments begun add up.
    Each source runs through all its records, in a new order, every epoch, so no
    record repeats before all were used, and a source's position carries across
    segments. A new schedule whose segments before sample c equal the old one (same
    starts, same weights once normalised) gives the same first c samples, so keep
    `num_samples` and `seed` and append segments when resuming with another mixture.

    Cost: construction O(#segments x #sources), a few KB; a lookup O(log #sources +
    log #segments) integer operations, plus one hash per source epoch met and one
    vectorised permutation call per source per batch. The blend is already mixed:
    read it in order with ``ExactlyOnceSampler(blend, shuffle=False)``, which splits
    it across ranks without padding (a `DistributedSampler` pads the last rank).
    """

    def __init__(
        self,
        sources: Mapping[str, Dataset | str | os.PathLike[str]],
        weights: Weights | Schedule,
        *,
        num_samples: int,
        seed: int = 0,
    ) -> None:
        if not isinstance(sources, Mapping) or not sources:
            raise VarstoreError(f"sources must be a non-empty dict name -> dataset or path, not {sources!r}")
        self.num_samples = as_int(num_samples, "num_samples")
        if not 1 <= self.num_samples <= sys.maxsize:
            bits = self.num_samples.bit_length()
            shown = f"{self.num_samples:,}" if bits <= 128 else f"a {bits:,}-bit integer"  # str() refuses 4,300+ digits
            raise VarstoreError(
                f"num_samples must be at least 1 and at most {sys.maxsize:,} (a dataset's len() must fit in an index), "
                f"not {shown}"
            )
        self.seed = as_int(seed, "seed")
        for name in sources:
            if not isinstance(name, str):
                raise VarstoreError(f"source names must be str, not {name!r}")
        self.names = sorted(sources)
        self._numbers = {name: number for number, name in enumerate(self.names)}
        self.sources = [_opened(name, sources[name]) for name in self.names]
        self._lengths = [len(source) for source in self.sources]
        self._name_keys = [_name_key(name) for name in self.names]
        self._orders = [
            Permutation(length, derive_key(_BLEND_PURPOSE, self.seed, name_key))
            for length, name_key in zip(self._lengths, self._name_keys)
        ]
        self._segments = self._build_segments(_as_schedule(weights))
        self._starts = [segment.start for segment in self._segments]
        self.version = self._fingerprint()

    def _fingerprint(self) -> str:
        """BLAKE2b-128 of what fixes sample k's record for every k, except the schedule, which may gain segments
        at a resume (see the class docstring): seed, length, and each source's name, length and version."""
        sources = [[name, length, dataset_version(source)]
                   for name, length, source in zip(self.names, self._lengths, self.sources)]
        identity = json.dumps({"seed": self.seed, "num_samples": self.num_samples, "sources": sources})
        return hashlib.blake2b(identity.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()

    def state_dict(self) -> dict[str, Any]:
        """The blend's identity, which torchdata's `StatefulDataLoader` saves from each worker: the blend holds no
        progress (the sampler does), but loading the state on another blend is refused."""
        return {"kind": "BlendedDataset", "dataset_version": self.version}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Check that `state` was saved from this blend (see `state_dict`)."""
        if not isinstance(state, dict) or state.get("kind") != "BlendedDataset":
            kind = state.get("kind") if isinstance(state, dict) else type(state).__name__
            raise VarstoreError(f"BlendedDataset.load_state_dict got a state of kind {kind!r}")
        check_version(state, self.version, "BlendedDataset")

    @classmethod
    def from_data_path(cls, data_path: str | Sequence[str], *, num_samples: int, seed: int = 0) -> BlendedDataset:
        """A blend spelled as Megatron's ``--data-path``: ``"0.3 /data/web 0.7 /data/code"`` (weight, path pairs; the
        paths name the sources) or one path alone. Weights written in decimal are taken exactly (0.3 is 3/10)."""
        words = data_path.split() if isinstance(data_path, str) else list(data_path)
        if len(words) == 1:
            return cls({words[0]: words[0]}, {words[0]: 1}, num_samples=num_samples, seed=seed)
        if not words or len(words) % 2:
            raise VarstoreError(f"a data path is 'weight path weight path ...' or one path, not {data_path!r}")
        weights: dict[str, Decimal | Fraction] = {}
        for weight, path in zip(words[::2], words[1::2]):
            if path in weights:
                raise VarstoreError(f"the data path names {path!r} twice; give it one weight")
            try:
                weights[path] = _spelled_weight(weight)
            except ValueError:
                raise VarstoreError(f"the data path gives {path!r} the weight {weight!r}, which is not a number") from None
        return cls({path: path for path in weights}, weights, num_samples=num_samples, seed=seed)

    def _build_segments(self, schedule: list[tuple[int, Weights]]) -> list[_Segment]:
        _check_starts([start for start, _ in schedule], self.num_samples)
        ends = [start for start, _ in schedule[1:]] + [self.num_samples]
        segments: list[_Segment] = []
        counts = [0] * len(self.names)
        for (start, weights), end in zip(schedule, ends):
            segment = _Segment(start, self._positive_weights(start, weights), counts)
            segments.append(segment)
            counts = segment.counts_after(end - start)
        return segments

    def _positive_weights(self, start: int, weights: Weights) -> dict[int, Fraction]:
        """The segment's positive weights by source number, each source checked to exist and to have records."""
        unknown = sorted(set(weights) - self._numbers.keys(), key=repr)  # keys of any types: sorted without comparing them
        if unknown:
            raise VarstoreError(f"the weights of the segment at sample {start} name unknown sources {unknown}; sources: {self.names}")
        positive = {}
        for name, weight in weights.items():
            exact = _exact_weight(name, weight, start)
            number = self._numbers[name]
            if exact and not self._lengths[number]:
                raise VarstoreError(f"source {name!r} has no records but weight {weight} in the segment at sample {start}")
            if exact:
                positive[number] = exact
        if not positive:
            raise VarstoreError(f"the segment at sample {start} gives no source a positive weight")
        return positive

    def __len__(self) -> int:
        return self.num_samples

    def __repr__(self) -> str:
        sources = ", ".join(f"{name}={length}" for name, length in zip(self.names, self._lengths))
        return f"BlendedDataset(num_samples={self.num_samples}, segments={len(self._segments)}, sources: {sources})"

    @property
    def proportion_bound(self) -> Fraction:
        """The most a source's count may stray from ``weight x samples`` within one segment (see the class docstring)."""
        return Fraction(max(segment.height for segment in self._segments), 2)

    def _segment(self, sample: int) -> _Segment:
        return self._segments[bisect.bisect_right(self._starts, sample) - 1]

    def _check_sample(self, sample: Any) -> int:
        try:
            index = operator.index(sample)
        except TypeError:  # a float tensor has __index__, and it raises TypeError
            index = None
        if index is None or isinstance(sample, (bool, np.bool_)):
            raise VarstoreError(f"blend samples are integers, not {type(sample).__name__}")
        if not 0 <= index < self.num_samples:
            raise RecordIndexError(f"sample {index} is out of range for a blend of {self.num_samples} samples")
        return index

    def _use(self, sample: int) -> tuple[int, int]:
        segment = self._segment(sample)
        return segment.locate(sample - segment.start)

    def locate(self, sample: int) -> tuple[str, int]:
        """(source name, record index in that source) of blend sample `sample`."""
        source, record = self._records([sample])[0]
        return self.names[source], record

    def _shuffled_position(self, source: int, use: int, epoch_maps: dict[tuple[int, int], tuple[int, int]]) -> int:
        """Where the source's `use` lands before P: its epoch position through the epoch's affine map."""
        length = self._lengths[source]
        epoch, position = divmod(use, length)
        if (source, epoch) not in epoch_maps:
            epoch_maps[source, epoch] = _epoch_map(length, self.seed, self._name_keys[source], epoch)
        a, b = epoch_maps[source, epoch]
        return (a * position + b) % length

    def _records(self, samples: Sequence[int]) -> list[tuple[int, int]]:
        """(source number, record) of each sample, with one vectorised permutation call per source met."""
        uses = [self._use(self._check_sample(sample)) for sample in samples]
        epoch_maps: dict[tuple[int, int], tuple[int, int]] = {}
        rows_by_source: dict[int, list[int]] = {}
        for row, (source, _) in enumerate(uses):
            rows_by_source.setdefault(source, []).append(row)
        records = [0] * len(uses)
        for source, rows in rows_by_source.items():
            positions = [self._shuffled_position(source, uses[row][1], epoch_maps) for row in rows]
            for row, record in zip(rows, self._orders[source](positions).tolist()):
                records[row] = record
        return [(source, record) for (source, _), record in zip(uses, records)]

    def describe(self, samples: int) -> dict[str, SourceProgress]:
        """For the blend's first `samples` samples: how many came from each source and where each source stands."""
        samples = as_int(samples, "samples")
        if not 0 <= samples <= self.num_samples:
            raise VarstoreError(f"describe takes a prefix length in [0, {self.num_samples}], not {samples}")
        segment = self._segments[bisect.bisect_right(self._starts, max(samples - 1, 0)) - 1]
        counts = segment.counts_after(samples - segment.start)
        progress = {}
        for name, count, length in zip(self.names, counts, self._lengths):
            epoch, position = divmod(count, length) if length else (0, 0)
            progress[name] = SourceProgress(count, epoch, position)
        return progress

    def __getitem__(self, sample: int) -> Any:
        return self.__getitems__([sample])[0]

    def __getitems__(self, samples: Sequence[int] | np.ndarray) -> list[Any]:
        """The samples, read with one batched call per source (its ``__getitems__`` if it has one)."""
        located = self._records(np.asarray(samples).tolist() if isinstance(samples, np.ndarray) else list(samples))
        rows_by_source: dict[int, list[int]] = {}
        for row, (source, _) in enumerate(located):
            rows_by_source.setdefault(source, []).append(row)
        batch: list[Any] = [None] * len(located)
        for source, rows in rows_by_source.items():
            values = self._read(source, [located[row][1] for row in rows])
            for row, value in zip(rows, values):
                batch[row] = value
        return batch

    def _read(self, source: int, records: list[int]) -> list[Any]:
        dataset = self.sources[source]
        if not hasattr(dataset, "__getitems__"):
            return [dataset[record] for record in records]
        values = dataset.__getitems__(records)
        if not isinstance(values, list) or len(values) != len(records):
            raise VarstoreError(
                f"source {self.names[source]!r} returned {type(values).__name__} for {len(records)} records; a blend "
                "needs one sample per record (a RecordDataset with flat_batches or on_damaged='skip' cannot be blended)"
            )
        return values


def _opened(name: str, source: Any) -> Dataset:
    """`source` itself if it is a dataset, else a `RecordDataset` of the path."""
    if isinstance(source, (str, os.PathLike)):
        return RecordDataset(source)
    if not hasattr(source, "__len__") or not hasattr(source, "__getitem__"):
        raise VarstoreError(f"source {name!r} must be a path or a map-style dataset with __len__ and __getitem__, not {source!r}")
    return source

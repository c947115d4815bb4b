"""PyTorch datasets, samplers and collation over varstore data (needs ``pip install varstore[torch]``).

- `RecordDataset`: map-style, one record per sample, batches read by one vectorised call.
- `TokenWindowDataset`: fixed ``seq_len + 1`` token windows cut across documents, for LM pretraining.
- `RecordStream`: iterable batches in block-shuffled order for sequential media, resumable mid-epoch.
- `BlendedDataset`: sources mixed by weight (or a weight schedule), every record once per source epoch, O(1) memory.
- `ExactlyOnceSampler`: distributed shuffling sampler with no padding, resumable mid-epoch.
- `collate_padded` / `collate_jagged`: variable-length batches as `PaddedBatch` / `JaggedBatch`.
"""

from __future__ import annotations

try:
    import torch  # noqa: F401
except ImportError as error:  # pragma: no cover - depends on the environment
    raise ImportError("varstore.torch needs PyTorch: pip install 'varstore[torch]'") from error

from .blended import BlendedDataset
from .collate import JaggedBatch, PaddedBatch, collate_jagged, collate_padded
from .datasets import RecordDataset
from .sampler import ExactlyOnceSampler
from .stream import RecordStream
from .token_windows import TokenWindowDataset

__all__ = [
    "BlendedDataset",
    "ExactlyOnceSampler",
    "JaggedBatch",
    "PaddedBatch",
    "RecordDataset",
    "RecordStream",
    "TokenWindowDataset",
    "collate_jagged",
    "collate_padded",
]

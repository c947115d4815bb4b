"""What `Reader` and `ShardedReader` share: a description of their codec, and pickling by path.

A reader pickles as its path only; unpickling in the receiving process (a
DataLoader worker, say) maps the files afresh there. (No lazy `__getattr__`
hook: defining one slows every attribute access, and so every read, by a third.)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .codecs import Codec


class ReaderBase:
    """Base of the readers. Subclasses implement `_open` (which sets `_codec`) and `close`."""

    path: str
    verify_reads: bool
    _codec: Codec

    def _open(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    @property
    def codec(self) -> str:
        """The codec name: ``bytes``, ``str``, ``ndarray`` or ``msgpack``."""
        return self._codec.name

    @property
    def dtype(self) -> np.dtype | None:
        """The element dtype of an ``ndarray`` store, else None."""
        return getattr(self._codec, "dtype", None)

    @property
    def shape(self) -> tuple[int, ...] | None:
        """The fixed trailing shape of an ``ndarray`` store's records, else None."""
        return getattr(self._codec, "shape", None)

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "verify_reads": self.verify_reads}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.path = state["path"]
        self.verify_reads = state["verify_reads"]
        self._open()

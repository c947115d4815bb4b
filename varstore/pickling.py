"""Readers pickle by path: the receiving process (a DataLoader worker, say) maps the files on first use."""

from __future__ import annotations

from typing import Any


class OpensOnFirstUse:
    """Base of the readers: pickles `path` and `verify_reads` only, and runs `_open` when first used after unpickling.

    `_open` must set `_closed`; until it has, any attribute the instance lacks triggers it.
    """

    path: str
    verify_reads: bool

    def _open(self) -> None:
        raise NotImplementedError

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "verify_reads": self.verify_reads}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.path = state["path"]
        self.verify_reads = state["verify_reads"]

    def __getattr__(self, name: str) -> Any:
        # Reached only for attributes not set yet: those of an unpickled reader that has not opened its files.
        state = self.__dict__
        if name.startswith("__") or "_closed" in state or "path" not in state or state.get("_opening"):
            raise AttributeError(name)
        state["_opening"] = True
        try:
            self._open()
        finally:
            del state["_opening"]
        return getattr(self, name)

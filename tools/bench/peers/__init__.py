"""One adapter per record store, written against each library's public API; `PEERS` lists them in table order."""

from __future__ import annotations

import importlib

from .base import Peer

# name -> module that defines `PEER`; imported only inside that peer's own subprocess.
PEER_MODULES = {
    "varstore": "varstore_shard",
    "floor": "floor",
    "megatron": "megatron_core",
    "hf-datasets": "hf_datasets",
    "lmdb": "lmdb_env",
    "h5py": "h5py_vlen",
    "mds": "mds",
    "litdata": "litdata_chunks",
    "lance": "lance_local",
    "list": "python_list",
}
REFERENCES = ("floor", "list")


def load(name: str) -> Peer:
    """The adapter of peer `name`; raises ImportError if its library is missing or broken."""
    return importlib.import_module(f"{__name__}.{PEER_MODULES[name]}").PEER

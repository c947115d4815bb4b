"""varstore over S3 read through obstore rather than fsspec (s3fs): the `varstore` peer with
``VARSTORE_TRANSPORT=obstore`` in its process (and so in its DataLoader workers), so that one run compares the
two transports varstore can read s3:// with (varstore/remote/transport.py says why fsspec is the default).
"""

from __future__ import annotations

import os
from typing import Any, Iterable

from torch.utils.data import Dataset

from .base_remote import Remote
from .varstore_remote import VarstoreRemote


class VarstoreObstoreRemote(VarstoreRemote):
    name, label = "varstore-obstore", "varstore (obstore transport)"

    def map_dataset(self, remote: Remote) -> Dataset:
        os.environ["VARSTORE_TRANSPORT"] = "obstore"
        return super().map_dataset(remote)

    def stream(self, remote: Remote, batch_size: int, workers: int, seed: int, shuffle: bool) -> Iterable[Any]:
        os.environ["VARSTORE_TRANSPORT"] = "obstore"
        return super().stream(remote, batch_size, workers, seed, shuffle)


PEER = VarstoreObstoreRemote()

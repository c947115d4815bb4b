"""litdata over S3 with its boto3 downloads instead of obstore.

litdata 0.2.x fetches chunks with obstore when it is installed, and builds obstore's client options
itself without ``allow_http``, so chunk downloads from an ``http://`` endpoint (the loopback server here,
or any plain-HTTP S3-compatible store) fail with "builder error: BadScheme". Without obstore it downloads
with its boto3 client, which honours the endpoint; this adapter turns obstore off the only way litdata
offers (its module-level availability flag), so litdata's streaming can be measured at all.
"""

from __future__ import annotations

from typing import Any

import litdata.streaming.downloader

from .base_remote import Remote
from .litdata_remote import LitdataRemote


class LitdataBoto3Remote(LitdataRemote):
    name, label = "litdata-boto3", "litdata (boto3, obstore off)"

    def _dataset(self, remote: Remote, shuffle: bool, seed: int = 42) -> Any:
        litdata.streaming.downloader._OBSTORE_AVAILABLE = False
        return super()._dataset(remote, shuffle, seed)


PEER = LitdataBoto3Remote()

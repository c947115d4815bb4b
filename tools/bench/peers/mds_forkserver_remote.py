"""MosaicML Streaming over S3 with DataLoader workers started by a fork server instead of forked.

Opening a `StreamingDataset` downloads ``index.json`` in the main process with a boto3 client that its
`Stream` keeps (``_downloader._s3_client``), its keep-alive connection still open. Forked workers (torch's
default on Linux) inherit that client and share the one connection, so concurrent shard downloads can
interleave: here some came back short or stalled until the 60 s read timeout, and an epoch failed with
"Relative sample index ... is not present in the shard". MDS drops the client when pickled, so workers
that receive the dataset pickled (spawn, forkserver) each make their own. A fork server that has
imported `bench.peers.mds` gives MDS its torchvision stand-in before the dataset is unpickled.
"""

from __future__ import annotations

import multiprocessing
from typing import Any

from .mds_remote import MDSRemote


class MDSForkserverRemote(MDSRemote):
    name, label = "mds-forkserver", "MDS (workers from a fork server)"

    @property
    def worker_start(self) -> Any:  # type: ignore[override]
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(["bench.peers.mds"])
        return context


PEER = MDSForkserverRemote()

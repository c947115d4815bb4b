"""What a training cluster asks of object storage: N nodes x ranks x DataLoader workers reading one dataset.

    python3 tools/simulate_scale.py [--nodes 1000] [--ranks 8] [--workers 8] [--dataset-tb 10] [--shards 40000]
                                    [--epochs 2] [--batch 64] [--record-kib 100] [--cache-gb 1000] ...

A deterministic model, no network: it deals every epoch's records (or shards) to the ranks the way the
samplers do, and counts the requests each node makes under each request model below, step by step, with the
node cache each node keeps. It prints, per model: the requests at open and the time S3 needs to serve them at
its published 5,500 GET/s per prefix, the request rates in training (the first second, the busiest second, the
mean of the last epoch) and how many prefixes those rates need, the node cache's hit rates and the bytes each
node receives. Its figures are in docs/object-storage.md ("At scale").

What it assumes:

- Records are all `--record-kib` KiB and shards all hold the same number of them; shards are named in one
  prefix, as varstore writes them (the "prefixes" columns say how many a rate would need instead).
- Map-style (a full shuffle): each epoch is a seeded permutation of all records, dealt to the N x ranks ranks
  as torch's `DistributedSampler` deals it (rank g takes positions g, g + world, ...); each rank cuts its share
  into batches, which its workers take in turn (batch j to worker j mod workers), so a node reads 1/N of each
  epoch's records, spread over all shards. A batch costs varstore one ranged GET per span of records within
  64 KiB of each other in one shard; MDS downloads each shard a sample is read from whole, then reads locally.
- Streams: each epoch is a seeded permutation of the shards, dealt to the ranks the same way; a rank reads its
  shards whole, one after another; a node downloads each of its shards once (its ranks' workers share it) when
  the rank is `SHARDS_AHEAD` shards before it, and all of the rank's workers read from that copy.
- Time: every rank consumes `--rank-samples-per-s` samples a second in lockstep (synchronous data-parallel
  steps), so step t of an epoch is at t x batch / rate seconds; a request is counted at the step whose batch
  needs it (prefetching moves requests earlier by a few steps, not their rate). Open requests are counted at
  time 0, apart from the rates. Workers start again at each epoch (torch's default, no persistent workers).
- The node cache (`--cache-gb`) keeps the index files from epoch to epoch if it holds all of them, and a
  stream's shards if it also holds every shard a node streams in the run; what it cannot hold is gone before
  the node needs it again (for MDS's random access a lower bound: an LRU cache thrashes under a full
  shuffle). Map-style whole copies (MDS's, and varstore's whole-shard fetches, which happen only then) stay
  if it holds the whole dataset; a fetched copy serves every later read at once (in varstore the fetch runs
  in the background and ranged reads go on until it lands).
- LIST requests count against the GET rate (S3 publishes GET/HEAD and PUT/COPY/POST/DELETE rates; a LIST is
  a GET of the bucket).

A small run (tests/test_simulate_scale.py) takes a fraction of a second; the default one about a minute of CPU
and 1.2 GB of memory (each epoch's permutation of 97 million records).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from varstore.format.header import HEADER_SIZE  # noqa: E402
from varstore.format.manifest import Manifest, ShardEntry  # noqa: E402

# S3's published GET/HEAD rate per partitioned prefix (docs.aws.amazon.com, "Best practices design patterns:
# optimizing Amazon S3 performance"; 3,500 PUT/s, which a reading run does not use).
S3_GETS_PER_PREFIX_S = 5_500
LIST_KEYS_PER_PAGE = 1_000  # ListObjectsV2 returns at most 1,000 keys a request
LIST_BYTES_PER_KEY = 300  # about that much XML per key listed (Key, LastModified, ETag, Size, StorageClass)

# varstore's requests (docs/object-storage.md, "What a read costs"; the remote open of issue 22 for NEW_*).
NEW_OPEN_GETS = 1  # a remote open: the manifest, one GET, no LIST
NEW_REOPEN_GETS_CACHED = 0  # a DataLoader worker's reopen, when the node cache holds that manifest version
TODAY_OPEN_HEADER_BYTES = 64  # before: every open also read each shard's 64-byte index header...
# ... after 1 LIST per LIST_KEYS_PER_PAGE objects and the manifest, in every process that opens, workers too.
FIRST_USE_EDGE_BYTES = 4 << 10  # first use of a shard on a node: its index, whole, and its data's first and last 4 KiB
FIRST_USE_GETS = 3
SPAN_GAP_BYTES = 64 << 10  # a batch's records within this gap of each other share one ranged GET
WHOLE_FETCH_FRACTION = 1 / 16  # map-style: past this share of a shard read by ranges, the shard is fetched whole
PART_BYTES = 8 << 20  # whole shards are downloaded in parts of this size
SHARDS_AHEAD = 2  # varstore.torch.prefetch.SHARDS_AHEAD: a stream fetches this many shards beyond the current one
INDEX_BYTES_PER_RECORD = 12  # spec/FORMAT.md §1.1: a u64 offset and a u32 CRC32C per record, one more offset

# MosaicML Streaming (its streaming/base/stream.py and storage/download.py): index.json is downloaded once per node
# (by the node's local leader); a shard is downloaded whole with boto3's download_file, which HEADs the object
# and GETs it in parts of its 8 MiB multipart chunk size.
MDS_OPEN_GETS_PER_NODE = 1
MDS_INDEX_BYTES_PER_SHARD = 278  # index.json per shard, measured on a 1,250-shard MDSWriter output
MDS_DOWNLOAD_HEADS = 1

SEED = 0
MODELS = ("varstore today", "varstore new", "MDS")
READ_MODELS = ("varstore new", "MDS")  # "varstore today" reads as "varstore new" does
PATTERNS = ("map-style, full shuffle", "stream")


@dataclass(frozen=True)
class Cluster:
    """The run simulated: who reads, what, how fast, with how much node cache."""

    nodes: int = 1000
    ranks: int = 8
    workers: int = 8
    dataset_bytes: int = 10 * 10**12
    shards: int = 40_000
    epochs: int = 2
    batch: int = 64
    record_bytes: int = 100 << 10
    cache_bytes: int = 1000 * 10**9
    rank_samples_per_s: float = 1000.0

    @property
    def world(self) -> int:
        return self.nodes * self.ranks

    @property
    def records_per_shard(self) -> int:
        return max(1, round(self.dataset_bytes / self.record_bytes / self.shards))

    @property
    def records(self) -> int:
        return self.records_per_shard * self.shards

    @property
    def shard_bytes(self) -> int:
        return self.records_per_shard * self.record_bytes

    @property
    def index_bytes(self) -> int:
        return HEADER_SIZE + 8 + INDEX_BYTES_PER_RECORD * self.records_per_shard

    @property
    def parts_per_shard(self) -> int:
        return math.ceil(self.shard_bytes / PART_BYTES)

    @property
    def steps_per_epoch(self) -> int:
        return math.ceil(self.records // self.world / self.batch)

    @property
    def step_seconds(self) -> float:
        return self.batch / self.rank_samples_per_s

    def manifest_bytes(self) -> int:
        """The size of the dataset's manifest.json, as varstore encodes it (CRC32Cs of the largest width)."""
        entry = ShardEntry("shard-000000", self.records_per_shard, self.shard_bytes, self.index_bytes, 4 << 28, 4 << 28)
        one = len(Manifest("bytes", {}, {}, [entry]).encode())
        two = len(Manifest("bytes", {}, {}, [entry, entry]).encode())
        return one + (two - one) * (self.shards - 1)


@dataclass
class Tally:
    """What one request model costs over the run: requests at open and per step, node-cache lookups, bytes."""

    open_requests: int = 0
    reopen_requests_per_epoch: int = 0  # at the start of each later epoch (workers starting again)
    step_requests: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    index_lookups: int = 0
    index_hits: int = 0
    data_lookups: int = 0
    data_hits: int = 0
    node_bytes: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))


def _permutation(values: np.ndarray, epoch: int, salt: int) -> np.ndarray:
    """`values` in epoch `epoch`'s seeded order (`salt` tells the records' order from the shards')."""
    return np.random.default_rng([SEED, salt, epoch]).permutation(values)


def _spans(cluster: Cluster, records: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The ranged GETs of one node's epoch, in time order: (step, worker on the node, shard, bytes) per span.
    `records` is (ranks, per rank) record numbers in each rank's order."""
    ranks, per_rank = records.shape
    position = np.arange(per_rank)
    step = np.broadcast_to(position // cluster.batch, records.shape).ravel()
    rank = np.repeat(np.arange(ranks), per_rank)
    record = records.ravel()
    group = step * ranks + rank  # one batch: time order first
    order = np.argsort(group.astype(np.int64) * cluster.records + record)
    group, record, step, rank = group[order], record[order], step[order], rank[order]
    shard = record // cluster.records_per_shard
    gap = (np.diff(record) - 1) * cluster.record_bytes
    starts = np.concatenate(([True], (np.diff(group) != 0) | (np.diff(shard) != 0) | (gap > SPAN_GAP_BYTES)))
    first = np.flatnonzero(starts)
    last = np.concatenate((first[1:], [len(record)])) - 1
    span_bytes = (record[last] - record[first] + 1) * cluster.record_bytes
    worker = rank[first] * cluster.workers + step[first] % cluster.workers
    return step[first], worker, shard[first], span_bytes


def _first_uses(shard: np.ndarray, known: np.ndarray) -> np.ndarray:
    """Indices of the events that use a shard first (in time order), among shards not `known` already."""
    first = np.full(len(known), len(shard))
    np.minimum.at(first, shard, np.arange(len(shard)))
    return np.sort(first[(first < len(shard)) & ~known])


def _lookups(worker: np.ndarray, shard: np.ndarray, workers: int, shards: int) -> int:
    """Distinct (worker process, shard) pairs among `workers` x `shards`: each such first use looks in the node
    cache."""
    seen = np.zeros(workers * shards, bool)
    seen[worker.astype(np.int64) * shards + shard] = True
    return int(seen.sum())


class Simulation:
    """Every node's requests under every model (`MODELS`) and access pattern (`PATTERNS`)."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        steps = cluster.steps_per_epoch * cluster.epochs
        self.tallies = {(model, pattern): Tally(step_requests=np.zeros(steps, np.int64),
                                                node_bytes=np.zeros(cluster.nodes, np.int64))
                        for model in MODELS for pattern in PATTERNS}
        indexes = cluster.shards * cluster.index_bytes
        streamed = min(cluster.shards, math.ceil(cluster.shards / cluster.nodes) * cluster.epochs) * cluster.shard_bytes
        # What the node cache keeps from one epoch to the next (see the module's docstring).
        self.keeps_indexes = cluster.cache_bytes >= indexes
        self.keeps_streamed = cluster.cache_bytes >= indexes + streamed
        self.holds_dataset = cluster.cache_bytes >= indexes + cluster.records * cluster.record_bytes

    def run(self) -> Simulation:
        cluster = self.cluster
        per_rank = cluster.records // cluster.world
        kind = np.int32 if cluster.records < 2**31 else np.int64
        records = [_permutation(np.arange(cluster.records, dtype=kind), epoch, 1)[: per_rank * cluster.world]
                   .reshape(per_rank, cluster.world) for epoch in range(cluster.epochs)]
        shards = [_permutation(np.arange(cluster.shards), epoch, 2) for epoch in range(cluster.epochs)]
        for node in range(cluster.nodes):
            ranks = slice(node * cluster.ranks, (node + 1) * cluster.ranks)
            spans = [_spans(cluster, dealt[:, ranks].T) for dealt in records]
            streams = [[dealt[rank :: cluster.world] for rank in range(cluster.world)[ranks]] for dealt in shards]
            for model in READ_MODELS:
                self._map_reads(model, node, spans)
                self._stream_reads(model, node, streams)
        for pattern in PATTERNS:  # varstore reads the same way today; only its open differs
            self.tallies["varstore today", pattern] = dataclasses.replace(self.tallies["varstore new", pattern])
            self.tallies["varstore today", pattern].node_bytes = self.tallies["varstore new", pattern].node_bytes.copy()
        self._opens()
        return self

    def _opens(self) -> None:
        cluster = self.cluster
        manifest = cluster.manifest_bytes()
        objects = 2 * cluster.shards + 1
        lists = math.ceil(objects / LIST_KEYS_PER_PAGE)
        today_requests = lists + 1 + cluster.shards
        today_bytes = objects * LIST_BYTES_PER_KEY + manifest + cluster.shards * TODAY_OPEN_HEADER_BYTES
        ranks, workers = cluster.world, cluster.world * cluster.workers
        for pattern in PATTERNS:
            today = self.tallies["varstore today", pattern]
            today.open_requests = (ranks + workers) * today_requests
            today.reopen_requests_per_epoch = workers * today_requests
            today.node_bytes += (cluster.ranks + cluster.ranks * cluster.workers * cluster.epochs) * today_bytes
            new = self.tallies["varstore new", pattern]
            new.open_requests = ranks * NEW_OPEN_GETS + workers * NEW_REOPEN_GETS_CACHED
            new.node_bytes += cluster.ranks * manifest
            mds = self.tallies["MDS", pattern]
            mds.open_requests = cluster.nodes * MDS_OPEN_GETS_PER_NODE
            mds.node_bytes += cluster.shards * MDS_INDEX_BYTES_PER_SHARD

    def _map_reads(self, model: str, node: int, spans: list[tuple[np.ndarray, ...]]) -> None:
        """One node's map-style epochs under `model`, its node cache starting empty."""
        cluster = self.cluster
        tally = self.tallies[model, PATTERNS[0]]
        indexed = np.zeros(cluster.shards, bool)
        whole = np.zeros(cluster.shards, bool)
        ranged = np.zeros(cluster.shards, np.int64)
        for epoch, (step, worker, shard, span_bytes) in enumerate(spans):
            at = epoch * cluster.steps_per_epoch + step
            if model == "MDS":  # every shard touched is downloaded whole, then read locally
                if not self.holds_dataset:
                    whole[:] = False
                fetched = _first_uses(shard, whole)
                np.add.at(tally.step_requests, at[fetched], MDS_DOWNLOAD_HEADS + cluster.parts_per_shard)
                tally.node_bytes[node] += len(fetched) * cluster.shard_bytes
                tally.data_lookups += len(shard)
                tally.data_hits += len(shard) - len(fetched)
                whole[shard[fetched]] = True
                continue
            if not self.keeps_indexes:
                indexed[:] = False
            lookups = _lookups(worker, shard, cluster.ranks * cluster.workers, cluster.shards)
            first = _first_uses(shard, indexed)
            np.add.at(tally.step_requests, at[first], FIRST_USE_GETS)
            tally.node_bytes[node] += len(first) * (cluster.index_bytes + 2 * FIRST_USE_EDGE_BYTES)
            tally.index_lookups += lookups
            tally.index_hits += lookups - len(first)
            indexed[shard[first]] = True
            local = whole[shard]
            if self.holds_dataset:
                local, triggers = _whole_fetches(shard, span_bytes, ranged, whole, cluster.shard_bytes * WHOLE_FETCH_FRACTION)
                np.add.at(tally.step_requests, at[triggers], cluster.parts_per_shard)
                tally.node_bytes[node] += len(triggers) * cluster.shard_bytes
            np.add.at(tally.step_requests, at[~local], 1)
            tally.node_bytes[node] += int(span_bytes[~local].sum())
            tally.data_lookups += len(shard)
            tally.data_hits += int(local.sum())

    def _stream_reads(self, model: str, node: int, dealt: list[list[np.ndarray]]) -> None:
        """One node's streaming epochs under `model`: `dealt[epoch][rank]` are the shards of each of its ranks."""
        cluster = self.cluster
        tally = self.tallies[model, PATTERNS[1]]
        whole = np.zeros(cluster.shards, bool)
        steps_per_shard = cluster.records_per_shard / cluster.batch
        requests = cluster.parts_per_shard + (MDS_DOWNLOAD_HEADS if model == "MDS" else FIRST_USE_GETS)
        received = cluster.shard_bytes + (0 if model == "MDS" else cluster.index_bytes + 2 * FIRST_USE_EDGE_BYTES)
        for epoch, ranks in enumerate(dealt):
            if not self.keeps_streamed:
                whole[:] = False
            for shards in ranks:
                fetched = ~whole[shards]
                # A rank's shard j is fetched when the rank starts on shard j - SHARDS_AHEAD.
                needed = (np.maximum(np.arange(len(shards)) - SHARDS_AHEAD, 0) * steps_per_shard).astype(np.int64)
                at = epoch * cluster.steps_per_epoch + np.minimum(needed, cluster.steps_per_epoch - 1)
                np.add.at(tally.step_requests, at[fetched], requests)
                tally.node_bytes[node] += int(fetched.sum()) * received
                lookups = len(shards) * cluster.workers  # every worker of the rank reads part of each shard
                if model != "MDS":
                    tally.index_lookups += lookups
                    tally.index_hits += lookups - int(fetched.sum())
                tally.data_lookups += lookups
                tally.data_hits += lookups - int(fetched.sum())
                whole[shards] = True


def _whole_fetches(shard: np.ndarray, span_bytes: np.ndarray, ranged: np.ndarray, whole: np.ndarray,
                   threshold: float) -> tuple[np.ndarray, np.ndarray]:
    """Which of an epoch's spans (in time order) a node reads from a whole copy of their shard, and which spans
    start a shard's whole fetch: the first whose bytes, with those read by ranges before, reach `threshold`;
    the spans after it are read from the copy. Updates the node's `ranged` bytes and `whole` copies."""
    order = np.lexsort((np.arange(len(shard)), shard))  # by shard, then time
    by_shard, sizes = shard[order], span_bytes[order]
    starts = np.concatenate(([True], by_shard[1:] != by_shard[:-1]))
    running = np.cumsum(sizes)
    before = (running - sizes)[starts][np.cumsum(starts) - 1]
    reached = ranged[by_shard] + running - before >= threshold
    after_reached = np.concatenate(([False], reached[:-1])) & ~starts
    copied = whole[by_shard]
    local = np.empty(len(shard), bool)
    local[order] = copied | after_reached
    triggers = order[reached & ~after_reached & ~copied]
    np.add.at(ranged, shard[~local], span_bytes[~local])
    whole[shard[triggers]] = True
    return local, triggers


@dataclass(frozen=True)
class Row:
    """One line of the table: a model's figures for one access pattern."""

    model: str
    pattern: str
    open_requests: int
    open_seconds: float
    reopen_requests_per_epoch: int
    first_second_gets: float
    peak_second_gets: float
    last_epoch_gets: float
    index_hit_rate: float | None  # None: the model has no per-shard index to look up
    data_hit_rate: float
    gb_per_node: float

    @property
    def prefixes_for_peak(self) -> int:
        """Prefixes (the shards spread evenly over them) that keep the busiest second under S3's GET rate."""
        return max(1, math.ceil(self.peak_second_gets / S3_GETS_PER_PREFIX_S))

    @property
    def prefixes_for_last_epoch(self) -> int:
        return max(1, math.ceil(self.last_epoch_gets / S3_GETS_PER_PREFIX_S))


def _per_second(cluster: Cluster, step_requests: np.ndarray) -> np.ndarray:
    """Requests in each second of training time."""
    seconds = (np.arange(len(step_requests)) * cluster.step_seconds).astype(np.int64)
    return np.bincount(seconds, weights=step_requests)


def rows(simulation: Simulation) -> list[Row]:
    cluster = simulation.cluster
    epoch_seconds = cluster.steps_per_epoch * cluster.step_seconds
    table = []
    for (model, pattern), tally in simulation.tallies.items():
        seconds = _per_second(cluster, tally.step_requests)
        last_epoch = tally.step_requests[-cluster.steps_per_epoch :].sum()
        table.append(Row(
            model, pattern, tally.open_requests, tally.open_requests / S3_GETS_PER_PREFIX_S,
            tally.reopen_requests_per_epoch, float(seconds[0]), float(seconds.max()), last_epoch / epoch_seconds,
            tally.index_hits / tally.index_lookups if tally.index_lookups else None,
            tally.data_hits / max(1, tally.data_lookups),
            float(tally.node_bytes.mean()) / 1e9,
        ))
    return sorted(table, key=lambda row: (PATTERNS.index(row.pattern), MODELS.index(row.model)))


def _size(count: float) -> str:
    """Bytes in decimal units, three significant digits or more: 9.83 MB, 1.17 GB, 10.0 TB."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if count >= scale:
            return f"{count / scale:,.3g} {unit}" if count < 1000 * scale else f"{count / scale:,.0f} {unit}"
    return f"{count:,.0f} bytes"


def render(simulation: Simulation) -> str:
    cluster = simulation.cluster
    epoch_seconds = cluster.steps_per_epoch * cluster.step_seconds
    keeps = (f"keeps the index files {'from epoch to epoch' if simulation.keeps_indexes else 'for one epoch only'}, "
             f"the streamed shards {'too' if simulation.keeps_streamed else 'for one epoch only'}, and "
             f"{'holds' if simulation.holds_dataset else 'cannot hold'} the dataset")
    cluster_line = (
        f"{cluster.nodes:,} nodes x {cluster.ranks} ranks x {cluster.workers} workers; {cluster.records:,} records of "
        f"{cluster.record_bytes / 1024:g} KiB ({_size(cluster.records * cluster.record_bytes)}) in "
        f"{cluster.shards:,} shards of {_size(cluster.shard_bytes)}; {cluster.epochs} epochs, batch "
        f"{cluster.batch}, {cluster.rank_samples_per_s:g} samples/s per rank (an epoch: {epoch_seconds:,.1f} s); "
        f"node cache {_size(cluster.cache_bytes)}: {keeps}.")
    node_line = (f"Per node: index files {_size(cluster.shards * cluster.index_bytes)}, manifest "
                 f"{_size(cluster.manifest_bytes())} (MDS index.json {_size(cluster.shards * MDS_INDEX_BYTES_PER_SHARD)}); "
                 f"S3: {S3_GETS_PER_PREFIX_S:,} GET/s per prefix.")
    header = ("| model | reads | open: requests | open: s at 5,500/s | reopen per epoch | GET/s, first second "
              "| GET/s, busiest second | GET/s, last epoch | prefixes: busiest second | prefixes: last epoch "
              "| index hits | data hits | GB per node |")
    lines = [cluster_line, node_line, "", header, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for row in rows(simulation):
        lines.append(
            f"| {row.model} | {row.pattern} | {row.open_requests:,} | {row.open_seconds:,.1f} "
            f"| {row.reopen_requests_per_epoch:,} | {row.first_second_gets:,.0f} | {row.peak_second_gets:,.0f} "
            f"| {row.last_epoch_gets:,.0f} | {row.prefixes_for_peak:,} | {row.prefixes_for_last_epoch:,} "
            f"| {'–' if row.index_hit_rate is None else format(row.index_hit_rate, '.1%')} "
            f"| {row.data_hit_rate:.1%} | {row.gb_per_node:,.2f} |")
    return "\n".join(lines) + "\n"


def _arguments(argv: list[str] | None) -> Cluster:
    defaults = Cluster()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=defaults.nodes)
    parser.add_argument("--ranks", type=int, default=defaults.ranks, help="ranks per node")
    parser.add_argument("--workers", type=int, default=defaults.workers, help="DataLoader workers per rank")
    parser.add_argument("--dataset-tb", type=float, default=defaults.dataset_bytes / 1e12)
    parser.add_argument("--shards", type=int, default=defaults.shards)
    parser.add_argument("--epochs", type=int, default=defaults.epochs)
    parser.add_argument("--batch", type=int, default=defaults.batch)
    parser.add_argument("--record-kib", type=float, default=defaults.record_bytes / 1024)
    parser.add_argument("--cache-gb", type=float, default=defaults.cache_bytes / 1e9, help="node cache per node")
    parser.add_argument("--rank-samples-per-s", type=float, default=defaults.rank_samples_per_s)
    arguments = parser.parse_args(argv)
    cluster = Cluster(arguments.nodes, arguments.ranks, arguments.workers, round(arguments.dataset_tb * 1e12),
                      arguments.shards, arguments.epochs, arguments.batch, round(arguments.record_kib * 1024),
                      round(arguments.cache_gb * 1e9), arguments.rank_samples_per_s)
    if cluster.records < cluster.world:
        parser.error(f"{cluster.records:,} records cannot give each of {cluster.world:,} ranks one")
    return cluster


def main(argv: list[str] | None = None) -> int:
    print(render(Simulation(_arguments(argv)).run()), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())

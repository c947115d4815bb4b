"""tools/simulate_scale.py on a cluster small enough to count by hand: 2 nodes x 1 rank x 2 DataLoader workers
reading 4 shards of 96 records of 100 KiB (each shard 9,830,400 bytes: two 8 MiB parts), batch 1, 100 samples/s
per rank, 2 epochs. Each node reads 192 of the 384 records an epoch, so (but with a chance of about 1e-12 under
the fixed seed) every worker touches every shard in every epoch."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tools" / "simulate_scale.py"
_spec = importlib.util.spec_from_file_location("simulate_scale", SCRIPT)
simulate_scale = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = simulate_scale  # its dataclasses look their module up there
_spec.loader.exec_module(simulate_scale)

RECORD_BYTES = 100 << 10
DATASET_BYTES = 4 * 96 * RECORD_BYTES
SMALL_CACHE = 100_000  # holds the four index files (64 + 8 + 12 x 96 = 1,224 bytes each), not one shard
LARGE_CACHE = 10**9  # holds the dataset


def _rows(cache_bytes: int) -> dict[tuple[str, str], object]:
    cluster = simulate_scale.Cluster(nodes=2, ranks=1, workers=2, dataset_bytes=DATASET_BYTES, shards=4, epochs=2,
                                     batch=1, record_bytes=RECORD_BYTES, cache_bytes=cache_bytes,
                                     rank_samples_per_s=100.0)
    return {(row.model, row.pattern): row for row in simulate_scale.rows(simulate_scale.Simulation(cluster).run())}


MAP, STREAM = "map-style, full shuffle", "stream"


def test_open_is_one_manifest_get_per_rank_and_nothing_per_worker():
    rows = _rows(SMALL_CACHE)
    new, today, mds = rows["varstore new", MAP], rows["varstore today", MAP], rows["MDS", MAP]
    assert (new.open_requests, new.reopen_requests_per_epoch) == (2, 0)  # 2 ranks, 1 GET each
    # Today every process (2 ranks, 4 workers) lists the 9 objects (1 LIST), GETs the manifest and 4 headers.
    assert (today.open_requests, today.reopen_requests_per_epoch) == (6 * 6, 4 * 6)
    assert mds.open_requests == 2  # index.json once per node
    assert today.open_seconds == pytest.approx(36 / 5500)


def test_first_use_of_a_shard_costs_three_requests_once_per_node_then_each_record_one_ranged_get():
    row = _rows(SMALL_CACHE)["varstore new", MAP]
    # Batches of one record are one ranged GET each: 384 an epoch over 192 steps of 10 ms (1.92 s).
    assert row.last_epoch_gets == pytest.approx(384 / 1.92)
    # Epoch 1 adds the first uses: 4 shards x 3 requests on each node, all within the first second.
    assert row.first_second_gets == 2 * 4 * 3 + 2 * 100
    # Each node's 2 workers look up each of 4 shards in each of 2 epochs (16 lookups); 4 miss.
    assert row.index_hit_rate == pytest.approx(12 / 16)
    assert row.data_hit_rate == 0


def test_a_shard_read_by_ranges_past_a_sixteenth_of_its_bytes_is_fetched_whole_when_the_cache_holds_the_dataset():
    row = _rows(LARGE_CACHE)["varstore new", MAP]
    # A sixteenth of 96 records is 6: on each node each shard costs 3 first-use requests, 6 ranged GETs (the
    # sixth reaches the threshold) and its 2 parts; every later read, epoch 2 included, is local.
    assert row.first_second_gets == 2 * 4 * (3 + 6 + 2)
    assert row.last_epoch_gets == 0
    reads = 2 * 384  # records read in the run, one span each
    assert row.data_hit_rate == pytest.approx((reads - 2 * 4 * 6) / reads)


def test_streams_download_each_shard_of_a_node_once_an_epoch_when_the_cache_cannot_keep_them():
    rows = _rows(SMALL_CACHE)
    varstore, mds = rows["varstore new", STREAM], rows["MDS", STREAM]
    # An epoch deals 2 shards to each node: varstore's first use (3) and 2 parts each; MDS a HEAD and 2 parts.
    assert varstore.last_epoch_gets == pytest.approx(4 * (3 + 2) / 1.92)
    assert mds.last_epoch_gets == pytest.approx(4 * (1 + 2) / 1.92)
    assert varstore.data_hit_rate == pytest.approx(1 / 2)  # each shard: 2 workers look, one download
    # MDS's node: index.json (4 entries), then 2 shards of 9,830,400 bytes in each epoch.
    assert mds.gb_per_node * 1e9 == pytest.approx(4 * simulate_scale.MDS_INDEX_BYTES_PER_SHARD + 2 * 2 * 9_830_400)


def test_command_prints_a_row_per_model_and_access_pattern():
    arguments = ["--nodes", "2", "--ranks", "1", "--workers", "2", "--shards", "4", "--batch", "1",
                 "--dataset-tb", str(DATASET_BYTES / 1e12), "--cache-gb", str(SMALL_CACHE / 1e9)]
    run = subprocess.run([sys.executable, str(SCRIPT), *arguments], capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 0, run.stderr
    rows = [line for line in run.stdout.splitlines() if line.startswith(("| varstore", "| MDS"))]
    assert len(rows) == 6

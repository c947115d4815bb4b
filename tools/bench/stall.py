"""Is the GPU waiting for data? ``python3 tools/bench/stall.py [--scale S] [--out DIR] [--peers a,b]``.

A training loop whose step is simulated: take a batch from a DataLoader (the harness's loader over the
"tokens" workload: batch 64, shuffled, jagged collation, `loading.dataset_for`), then "compute" for a fixed
step time. Peers are shuffled by torch's `RandomSampler`; varstore by its own `ExactlyOnceSampler`, whose
look-ahead has the pages of the coming batches read during the steps, and again by `RandomSampler` (a row of
its own) for what a loader without it gets. The step is a ``time.sleep``: a GPU step leaves the CPU free while the host waits on the
device, and on this 2-core machine a busy-wait would take a core from the loader's workers and measure
the machine, not the store. The stall is the fraction of wall time spent blocked in ``next(loader)``,
after the first batch (worker start-up, reported apart as ``first_batch_s``).

Each peer is built (tokens only, `suite.build_workload`) and measured in its own subprocess in
``.venv-bench``, for 0, 1 and 2 workers, step times `STEP_MS`, warm (files read once into the page
cache) and cold (the files' pages evicted with ``POSIX_FADV_DONTNEED`` right before the loader is
made, as the harness's cold reads do; the pages left resident are recorded). Writes ``stall.json`` and
``stall.md`` to DIR (default ``bench-out/stall``) and prints the table.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import os
import shutil
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import environment  # noqa: E402

STEP_MS = (5, 20)
# The samplers each peer is measured with; the first one's cases are keyed without its name.
SAMPLERS = {"varstore": ("ExactlyOnceSampler", "RandomSampler")}
DEFAULT_SAMPLERS = ("RandomSampler",)
WORKERS = (0, 1, 2)
CACHES = ("warm", "cold")
BUDGET_S = 2.0
ZERO_STALL = 0.01
PEER_TIMEOUT_S = 600


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", type=float, default=1.0, help="workload size factor (1 = default sizes)")
    parser.add_argument("--out", default=str(environment.ROOT / "bench-out" / "stall"), help="output directory")
    parser.add_argument("--peers", help="comma-separated subset of peers (default: all)")
    parser.add_argument("--measure", metavar="PEER", help=argparse.SUPPRESS)  # the per-peer subprocess
    parser.add_argument("--result", help=argparse.SUPPRESS)
    return parser.parse_args()


def stalled_loop(loader: Any, step_s: float, budget: float) -> dict[str, float]:
    """Seconds blocked in ``next`` over all seconds, for steps of `step_s` until `budget` seconds pass."""
    iterator = iter(loader)
    started = time.perf_counter()
    next(iterator)
    first = time.perf_counter() - started
    waited, steps, start = 0.0, 0, time.perf_counter()
    while time.perf_counter() - start < budget:
        before = time.perf_counter()
        next(iterator)
        waited += time.perf_counter() - before
        time.sleep(step_s)
        steps += 1
    total = time.perf_counter() - start
    del iterator  # shuts the workers down, so no process still maps the files at the next eviction
    return {"stall": waited / total, "first_batch_s": first, "steps": steps, "wait_ms_per_step": waited / steps * 1e3}


def measure_one(peer: Any, workload: Any, directory: str, workers: int, step_ms: int, cache: str,
                sampler_name: str) -> dict[str, float]:
    import torch
    from torch.utils.data import DataLoader, RandomSampler
    from varstore.torch import ExactlyOnceSampler, collate_jagged

    from bench import measure, suite
    from bench.loading import SAMPLES, dataset_for

    gc.collect()
    files = measure.files_under(directory)
    if cache == "warm":
        measure.warm(files)
    else:
        measure.evict(files)
    resident_kb = measure.resident_bytes(files) / 1024
    dataset = dataset_for(peer, workload, directory, "default")
    if sampler_name == "ExactlyOnceSampler":
        sampler = ExactlyOnceSampler(dataset, seed=step_ms)  # one epoch: 200,000 samples, more than a budget takes
    else:
        sampler = RandomSampler(dataset, num_samples=SAMPLES, generator=torch.Generator().manual_seed(step_ms))
    loader = DataLoader(dataset, batch_size=suite.LOADER_BATCH, sampler=sampler, num_workers=workers,
                        collate_fn=collate_jagged)
    figures = stalled_loop(loader, step_ms / 1e3, BUDGET_S)
    figures["resident_kb_at_start"] = resident_kb
    del loader, sampler, dataset
    return figures


def measure_peer(name: str, scale: float, data: str) -> dict[str, Any]:
    """Build the tokens workload of peer `name`, then every (workers, step, cache) case; its files go afterwards."""
    from bench import suite
    from bench.peers import load
    from bench.workloads import by_name, cached_records

    peer = load(name)
    workload = by_name(scale, suite.LOADER_WORKLOAD)
    directory = suite.workload_directory(data, peer, workload)
    built = suite.build_workload(peer, workload, directory)
    cached_records.cache_clear()
    if not built["reads_back"]:
        return {"error": "the built tokens workload does not read back"}
    cases: dict[str, Any] = {}
    samplers = SAMPLERS.get(name, DEFAULT_SAMPLERS)
    try:
        for workers, step_ms, cache, sampler_name in itertools.product(WORKERS, STEP_MS, CACHES, samplers):
            key = case_key(cache, step_ms, workers, None if sampler_name == samplers[0] else sampler_name)
            try:
                cases[key] = measure_one(peer, workload, directory, workers, step_ms, cache, sampler_name)
            except Exception as error:
                traceback.print_exc()
                cases[key] = {"error": f"{type(error).__name__}: {str(error).splitlines()[-1:]}"[:300]}
    finally:
        shutil.rmtree(os.path.join(data, peer.name), ignore_errors=True)
    return {"cases": cases, "write_s": built["write_s"], "samplers": list(samplers)}


def case_key(cache: str, step_ms: int, workers: int, sampler_name: str | None) -> str:
    """A case's key in the results; `sampler_name` only for a peer's second sampler."""
    return f"{cache}@{step_ms}ms@{workers}w" + (f"@{sampler_name}" if sampler_name else "")


def workers_needed(cases: dict[str, Any], cache: str, step_ms: int, sampler_name: str | None = None) -> int | None:
    """The fewest workers whose stall is under `ZERO_STALL`, or None if no worker count here reaches it."""
    for workers in WORKERS:
        stall = cases.get(case_key(cache, step_ms, workers, sampler_name), {}).get("stall")
        if stall is not None and stall < ZERO_STALL:
            return workers
    return None


def table(results: dict[str, Any]) -> str:
    from bench.report import LABELS

    header = ["peer", "cache"] + [f"{step} ms: stall @0/1/2 workers, workers for <1%" for step in STEP_MS]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name, result in results["peers"].items():
        if "cases" not in result:
            lines.append(f"| {LABELS.get(name, name)} | — | {result.get('skipped') or result.get('error')} |" + " |" * (len(STEP_MS) - 1))
            continue
        cases = result["cases"]
        samplers = result.get("samplers", DEFAULT_SAMPLERS)
        for sampler_name, cache in itertools.product(samplers, CACHES):
            second = None if sampler_name == samplers[0] else sampler_name
            cells = []
            for step in STEP_MS:
                stalls = [cases.get(case_key(cache, step, w, second), {}).get("stall") for w in WORKERS]
                shown = " / ".join("err" if s is None else f"{s:.1%}" for s in stalls)
                needed = workers_needed(cases, cache, step, second)
                cells.append(f"{shown} → {'>2' if needed is None else needed}")
            label = LABELS.get(name, name) + (f" ({sampler_name})" if len(samplers) > 1 else "")
            lines.append(f"| {label} | {cache} | " + " | ".join(cells) + " |")
    meta = results["meta"]
    lines.append("")
    lines.append(f"Stall = time blocked in `next(loader)` / wall time over {BUDGET_S:.0f} s after the first batch; step = "
                 f"`time.sleep`; tokens workload ({meta['records']} records), batch 64, shuffled; "
                 f"`{meta['command']}`, {meta['minutes']:.1f} min, load {meta['load_before']} → {meta['load_after']}. "
                 "Cold = the files' pages evicted right before the loader starts; a store that reads ahead re-caches a "
                 "dataset smaller than memory within the run. varstore (ExactlyOnceSampler): its look-ahead advises "
                 "the pages of the coming batches; (RandomSampler): the same loader without it. `list in RAM` is the DataLoader's own cost (collation, "
                 "and with workers the hand-over of each batch to the main process): no store can stall less.")
    return "\n".join(lines)


def _run_peer(name: str, scale: float, out: Path) -> dict[str, Any]:
    from bench.run import StepRunner

    runner = StepRunner(scale, out)
    result_path = runner.logs / f"{name}.json"
    command = [sys.executable, "-m", "bench.stall", "--measure", name, "--scale", str(scale), "--out", str(out),
               "--result", str(result_path)]
    started = time.perf_counter()
    with open(runner.logs / f"{name}.log", "w") as log:
        try:
            subprocess.run(command, env=runner.env, stdout=log, stderr=subprocess.STDOUT, timeout=PEER_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return {"error": f"timed out after {PEER_TIMEOUT_S} s"}
    print(f"  {name}: {time.perf_counter() - started:.1f} s", flush=True)
    if not result_path.exists():
        return {"error": f"no result; see logs/{name}.log"}
    return json.loads(result_path.read_text())


def _measure_in_subprocess(arguments: argparse.Namespace) -> None:
    try:
        result = measure_peer(arguments.measure, arguments.scale, str(Path(arguments.out) / "data"))
    except ImportError as error:
        result = {"skipped": f"import failed: {type(error).__name__}: {error}"}
    except Exception as error:
        traceback.print_exc()
        result = {"error": f"{type(error).__name__}: {error}"[:300]}
    Path(arguments.result).write_text(json.dumps(result, indent=1))


def main() -> int:
    arguments = _arguments()
    if arguments.measure:
        _measure_in_subprocess(arguments)
        return 0
    environment.run_in_bench_venv(__file__)
    from bench.machine import describe_machine
    from bench.peers import PEER_MODULES
    from bench.run import _load
    from bench.suite import LOADER_WORKLOAD
    from bench.workloads import by_name

    peers = arguments.peers.split(",") if arguments.peers else list(PEER_MODULES)
    out = Path(arguments.out).resolve()
    shutil.rmtree(out / "data", ignore_errors=True)
    started, load_before = time.time(), _load()
    results: dict[str, Any] = {"peers": {}}
    for name in peers:
        print(f"{name}:", flush=True)
        results["peers"][name] = _run_peer(name, arguments.scale, out)
    shutil.rmtree(out / "data", ignore_errors=True)
    results["meta"] = {
        **describe_machine(str(out)),
        "command": " ".join(["python3", "tools/bench/stall.py", *sys.argv[1:]]),
        "scale": arguments.scale, "records": by_name(arguments.scale, LOADER_WORKLOAD).count,
        "load_before": load_before, "load_after": _load(), "minutes": (time.time() - started) / 60,
    }
    text = table(results)
    (out / "stall.json").write_text(json.dumps(results, indent=1))
    (out / "stall.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

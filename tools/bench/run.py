"""Benchmark varstore beside its peers: ``python3 tools/bench/run.py [--scale S] [--out DIR] [--peers a,b]``.

Sets up ``.venv-bench`` if needed and re-runs itself there. Each peer is measured
in its own subprocesses (build, warm reads, one per workload for cold reads, one
per dataset size for open, one per DataLoader worker count) on the same seeded
workloads, one peer after another;
its files are deleted before the next peer starts. Writes ``results.json``,
``results.md`` and ``chart.png`` to DIR (default ``bench-out/``), and, for a full
run at the default scale, to ``tools/bench/results/`` as well.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import environment  # noqa: E402

ROOT = environment.ROOT
RESULTS_DIR = ROOT / "tools" / "bench" / "results"
STEP_TIMEOUT = 1800
LOADER_WORKERS = (0, 1, 2)


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", type=float, default=1.0, help="workload size factor (1 = default sizes)")
    parser.add_argument("--out", default=str(ROOT / "bench-out"), help="output directory")
    parser.add_argument("--peers", help="comma-separated subset of peers (default: all)")
    return parser.parse_args()


def _load() -> str:
    with open("/proc/loadavg") as stream:
        return " ".join(stream.read().split()[:3])


class StepRunner:
    """Runs one measurement step of one peer in a fresh interpreter and returns its JSON result."""

    def __init__(self, scale: float, out: Path) -> None:
        self.scale, self.out = scale, out
        self.data = out / "data"
        self.logs = out / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.env = {
            **os.environ,
            "PYTHONPATH": str(ROOT / "tools"),
            "HF_DATASETS_CACHE": str(self.data / "hf-cache"),
            "HF_HUB_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1",
            "PYTHONWARNINGS": "ignore",
        }

    def __call__(self, step: str, peer: str, *extra: str) -> dict[str, Any]:
        name = "-".join([peer, step, *[part.lstrip("-") for part in extra]])
        result_path = self.logs / f"{name}.json"
        command = [sys.executable, "-m", "bench.suite", step, peer, "--scale", str(self.scale),
                   "--data", str(self.data), "--result", str(result_path), *extra]
        started = time.perf_counter()
        with open(self.logs / f"{name}.log", "w") as log:
            try:
                code = subprocess.run(command, env=self.env, stdout=log, stderr=subprocess.STDOUT, timeout=STEP_TIMEOUT).returncode
            except subprocess.TimeoutExpired:
                return {"error": f"{step} timed out after {STEP_TIMEOUT} s"}
        print(f"  {name}: {time.perf_counter() - started:.1f} s", flush=True)
        if not result_path.exists():
            return {"error": f"{step} exited with code {code} and no result; see logs/{name}.log"}
        return json.loads(result_path.read_text())


def _merge(peer_result: dict[str, Any], step_result: dict[str, Any], step: str) -> None:
    if "error" in step_result:
        peer_result["errors"].append(f"{step}: {step_result['error']}")
    for workload, figures in step_result.get("figures", {}).items():
        peer_result["figures"].setdefault(workload, {}).update(figures)


def measure_peer(run: StepRunner, peer: str) -> dict[str, Any]:
    """Every step for one peer, in order; the peer's data is deleted afterwards."""
    from bench.workloads import open_test_workloads, workloads

    result: dict[str, Any] = {"skipped": None, "errors": [], "figures": {}}
    built = run("build", peer)
    if built.get("skipped"):
        result["skipped"] = built["skipped"]
        return result
    _merge(result, built, "build")
    _merge(result, run("reads", peer), "reads")
    for workload in workloads(run.scale):
        if "write_s" in result["figures"].get(workload.name, {}):
            _merge(result, run("cold", peer, "--workload", workload.name), f"cold {workload.name}")
    for workload in open_test_workloads(run.scale):
        _merge(result, run("open", peer, "--workload", workload.name), f"open {workload.name}")
    variants = ("default", "flat") if peer == "varstore" else ("default",)
    for variant in variants:
        for workers in LOADER_WORKERS:
            _merge(result, run("loader", peer, "--workers", str(workers), "--variant", variant), f"loader {workers}")
    shutil.rmtree(run.data / peer, ignore_errors=True)
    return result


def main() -> int:
    arguments = _arguments()
    environment.run_in_bench_venv(__file__)
    from bench import report
    from bench.machine import describe_machine
    from bench.peers import PEER_MODULES

    peers = arguments.peers.split(",") if arguments.peers else list(PEER_MODULES)
    out = Path(arguments.out).resolve()
    shutil.rmtree(out / "data", ignore_errors=True)
    run = StepRunner(arguments.scale, out)
    started, load_before = time.time(), _load()
    results: dict[str, Any] = {"peers": {}}
    for peer in peers:
        print(f"{peer}:", flush=True)
        results["peers"][peer] = measure_peer(run, peer)
    results["meta"] = {
        **describe_machine(str(out)),
        "command": " ".join(["python3", "tools/bench/run.py", *sys.argv[1:]]),
        "scale": arguments.scale,
        "load_before": load_before,
        "load_after": _load(),
        "minutes": (time.time() - started) / 60,
    }
    shutil.rmtree(run.data, ignore_errors=True)
    destinations = [out]
    if arguments.scale == 1 and not arguments.peers:
        destinations.append(RESULTS_DIR)
    table = report.write(results, destinations)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())

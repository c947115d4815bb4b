"""Remote datasets: varstore, MosaicML Streaming, litdata and Lance reading the same records from one S3 bucket.

    python3 tools/bench/remote.py [--scale S] [--out DIR] [--peers a,b] [--modes a,b] [--workers N]
                                  [--latency-ms MS[,MS...]]

Sets up ``.venv-bench`` if needed and re-runs itself there. moto's S3 server runs on 127.0.0.1 behind the
tests' fault proxy (tests/helpers_fault_proxy.py), which delays every request by each of ``--latency-ms`` in
turn (0 and 20 by default: one table each) and counts requests and response body bytes. The ``varstore-http``
peer reads its dataset over ``http://`` from nginx (Debian's ``nginx-light``), which serves the written
directory read-only on 127.0.0.1 behind a second such proxy: a server whose ranged reads cost a ``pread``
rather than moto's Python (without nginx on the machine that peer's rows fail, saying so). Nothing leaves the
machine.

Each peer writes the "blobs" workload (4,000 records of ~9 KB at scale 1) as its own shards of about
`SHARD_BYTES`, in its own process; the files are uploaded as they are under ``s3://BUCKET/<peer>/``
straight to moto (not timed, not counted), or left under nginx's root. Then, at each latency, each peer is
measured in a fresh process with an empty cache directory, reading through the proxy:

- ``map``: one epoch of a DataLoader with a shuffling `RandomSampler` (batch 64, ``--workers`` workers)
  over the peer's map-style dataset (varstore's `RecordDataset` reads a batch through ``__getitems__``, Lance
  with one ``take``; MDS and litdata read sample by sample with ``dataset[i]``);
- ``map-blocks``: the same with varstore's `ExactlyOnceSampler(block_size=MAP_BLOCK_SIZE)`, the block
  shuffle for object storage; the other peers keep the `RandomSampler` (their own block shuffles are their
  streams');
- ``stream``: one epoch of the peer's streaming dataset in its own shuffled order, batch 64;
- ``stream-ordered``: the same in stored order (``shuffle=False``).

Two peers are also measured in a second configuration, because their default one fails here for a reason
found and explained in their adapters: MDS with workers from a fork server (forked workers share the
main process's S3 connection: peers/mds_forkserver_remote.py) and litdata with obstore off (its obstore
client refuses http:// endpoints: peers/litdata_boto3_remote.py).

Above each table, the ceilings (`CEILING_RUNS`): for each server, `--workers` threads of one fresh process (one
client each, as many as the streams' workers, each of which downloads one shard at a time) each GET the data
objects of a varstore dataset in turn, whole or one random 64 KiB range at a time, for `CEILING_SECONDS`;
once with a bare client (boto3 for S3, http.client for nginx) and once with varstore's own transport
(`RemoteLocation.transport()`: the retries, deadlines and checks of every varstore read). At 0 ms the bare
client's figures are the server's own ceiling on this machine (with the proxy's: nginx is measured once more
without it, at no added latency, to show what the proxy costs); varstore's whole-object figure is the ceiling its
whole-shard downloads are judged against.

Each epoch is checked: sample count, bytes and the sum of the samples' CRC32s must equal the records'.
Requests and bytes are all the process sent and received, opening the dataset included; "MB/s per process"
is the bytes received over the epoch's seconds, divided by the processes reading (the workers, or the main
process without them). Writes ``results.json`` and ``results.md`` to DIR (default ``bench-out/remote``) and
prints the tables.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import importlib
import json
import os
import pwd
import random
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.parse
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import environment  # noqa: E402

ROOT = environment.ROOT
REMOTE_PEERS = {"varstore": "varstore_remote", "varstore-obstore": "varstore_obstore_remote",
                "mds": "mds_remote", "mds-forkserver": "mds_forkserver_remote",
                "litdata": "litdata_remote", "litdata-boto3": "litdata_boto3_remote",
                "varstore-http": "varstore_remote", "lance": "lance_remote"}
LABELS = {"varstore": "varstore", "varstore-obstore": "varstore (obstore transport)",
          "mds": "MosaicML Streaming (MDS)", "mds-forkserver": "MDS (fork-server workers)",
          "litdata": "litdata", "litdata-boto3": "litdata (boto3, obstore off)",
          "varstore-http": "varstore, http:// from nginx", "lance": "Lance"}
WORKLOAD = "blobs"
RECORDS = 4000
MIN_RECORDS = 200
SHARD_BYTES = 8 << 20
BATCH = 64
SEED = 0
BUCKET = "varstore-bench"
KEY = SECRET = "testing"
# mode -> how the table names its epoch
MODES = {"map": "shuffled map-style", "map-blocks": "shuffled map-style, block shuffle (varstore's sampler; "
         "others: RandomSampler)", "stream": "streaming, shuffled", "stream-ordered": "streaming, in order"}
# The block shuffle of the map-blocks epoch: records per block (and per window), 4 contiguous runs per batch.
MAP_BLOCK_SIZE = 16
EPOCH_BUDGET_S = 60.0
STEP_TIMEOUT_S = 300
PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")
# Peers whose dataset nginx serves over http:// (the others read theirs from moto over s3://).
HTTP_PEERS = frozenset({"varstore-http"})
DEFAULT_LATENCIES_MS = "0,20"
# The ceilings above each table: (client, what one request reads) for each server, each run this long over the
# data objects of a varstore dataset stored under CEILING_PREFIX.
CEILING_RUNS = (("bare", "whole"), ("bare", "range"), ("varstore", "whole"), ("varstore", "range"))
CEILING_SECONDS = 5.0
CEILING_RANGE_BYTES = 64 << 10
CEILING_PREFIX = "ceiling"
NGINX_START_TIMEOUT_S = 10.0


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", type=float, default=1.0, help=f"records = {RECORDS} x S")
    parser.add_argument("--out", default=str(ROOT / "bench-out" / "remote"), help="output directory")
    parser.add_argument("--peers", help=f"comma-separated subset of {','.join(REMOTE_PEERS)}")
    parser.add_argument("--modes", type=_modes, default=list(MODES),
                        help=f"comma-separated subset of the epochs {','.join(MODES)} (default: all)")
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers (default 2)")
    parser.add_argument("--latency-ms", type=_latencies, default=_latencies(DEFAULT_LATENCIES_MS),
                        help=f"delays added to every request, one run each (default {DEFAULT_LATENCIES_MS})")
    parser.add_argument("--child", help=argparse.SUPPRESS)  # one step of one peer, as JSON (internal)
    return parser.parse_args()


def _latencies(text: str) -> list[float]:
    """`0,20` as [0.0, 20.0]: the milliseconds added to every request, one run of every peer for each."""
    try:
        latencies = [float(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected milliseconds separated by commas, got {text!r}") from None
    if any(latency < 0 for latency in latencies):
        raise argparse.ArgumentTypeError(f"a latency cannot be negative: {text!r}")
    return latencies


def _modes(text: str) -> list[str]:
    """`stream,stream-ordered` as the epochs to measure, each one of `MODES`, in `MODES`' order."""
    chosen = set(text.split(","))
    if not chosen <= set(MODES):
        raise argparse.ArgumentTypeError(f"unknown epochs {sorted(chosen - set(MODES))}; choose from {','.join(MODES)}")
    return [mode for mode in MODES if mode in chosen]


def _workload(scale: float) -> Any:
    from bench.workloads import Workload

    return Workload(WORKLOAD, max(MIN_RECORDS, round(RECORDS * scale)), "bytes")


# The child: one step of one peer in a fresh process.


def _load_peer(name: str) -> Any:
    return importlib.import_module(f"bench.peers.{REMOTE_PEERS[name]}").PEER


def _buffer(sample: Any) -> Any:
    """A sample's bytes as a buffer: bytes as they are, a uint8 tensor through numpy."""
    return sample.numpy() if hasattr(sample, "numpy") else sample


def _fingerprint(records: Iterable[Any]) -> dict[str, int]:
    """Count, bytes and the sum of CRC32s of records in any order: equal sums mean the same records read
    back whole (up to a collision), each once."""
    count = total = crc_sum = 0
    for record in records:
        buffer = _buffer(record)
        count += 1
        total += memoryview(buffer).nbytes
        crc_sum += zlib.crc32(buffer)
    return {"samples": count, "bytes": total, "crc_sum": crc_sum}


def _epoch(open_batches: Any, expected: dict[str, int]) -> dict[str, Any]:
    """Open a peer's loader, then read one epoch of batches (stopping after `EPOCH_BUDGET_S`)."""
    started = time.perf_counter()
    batches = open_batches()
    opened = time.perf_counter()
    seen = {"samples": 0, "bytes": 0, "crc_sum": 0}
    first_batch_s = None
    stopped = False
    for batch in batches:
        for name, value in _fingerprint(batch).items():
            seen[name] += value
        if first_batch_s is None:
            first_batch_s = time.perf_counter() - opened
        if time.perf_counter() - opened > EPOCH_BUDGET_S:
            stopped = True
            break
    epoch_s = time.perf_counter() - opened
    if stopped:
        check = f"partial: {seen['samples']:,} of {expected['samples']:,} samples in {EPOCH_BUDGET_S:g} s"
    else:
        check = "ok" if seen == expected else f"mismatch: read {seen}, expected {expected}"
    return {
        "open_s": opened - started, "first_batch_s": first_batch_s, "epoch_s": epoch_s,
        "samples": seen["samples"], "samples_s": seen["samples"] / epoch_s, "check": check,
    }


def _map_loader(peer: Any, remote: Any, workers: int, blocks: bool) -> Any:
    import torch
    from torch.utils.data import DataLoader, RandomSampler

    from bench.peers.base_remote import keep_list

    dataset = peer.map_dataset(remote)
    sampler = RandomSampler(dataset, generator=torch.Generator().manual_seed(SEED))
    if blocks and peer.name.startswith("varstore"):  # every varstore peer: the same datasets, other transports
        from varstore.torch import ExactlyOnceSampler

        sampler = ExactlyOnceSampler(dataset, seed=SEED, block_size=MAP_BLOCK_SIZE, rank=0, world_size=1)
    return DataLoader(dataset, batch_size=BATCH, sampler=sampler, num_workers=workers, collate_fn=keep_list,
                      multiprocessing_context=peer.worker_start if workers else None)


# A reader of one object or one range of it: (url, size, range or None) -> body bytes received.
ObjectReader = Callable[[str, int, "tuple[int, int] | None"], int]


def _bare_reader(task: dict[str, Any]) -> ObjectReader:
    """GETs through the plainest client of the server: boto3 for S3, one keep-alive http.client connection for
    nginx."""
    if task["server"] == "s3":
        import boto3

        client = boto3.session.Session().client("s3", endpoint_url=task["endpoint_url"])  # one session per thread

        def read_s3(url: str, size: int, byte_range: tuple[int, int] | None) -> int:
            bucket, _, key = url.removeprefix("s3://").partition("/")
            extra = {} if byte_range is None else {"Range": f"bytes={byte_range[0]}-{byte_range[1] - 1}"}
            return len(client.get_object(Bucket=bucket, Key=key, **extra)["Body"].read())

        return read_s3
    address = urllib.parse.urlsplit(task["endpoint_url"])
    connection = http.client.HTTPConnection(address.hostname, address.port)

    def read_http(url: str, size: int, byte_range: tuple[int, int] | None) -> int:
        headers = {} if byte_range is None else {"Range": f"bytes={byte_range[0]}-{byte_range[1] - 1}"}
        connection.request("GET", urllib.parse.urlsplit(url).path, headers=headers)
        response = connection.getresponse()
        body = response.read()
        if response.status not in (200, 206):
            raise OSError(f"GET {url}: HTTP {response.status}")
        return len(body)

    return read_http


def _varstore_reader(task: dict[str, Any], local: str) -> ObjectReader:
    """Reads through varstore's transport: whole objects downloaded to a file, as the node cache does, ranges
    into memory, as a map-style batch does."""
    from varstore.remote.location import RemoteLocation

    options = {"endpoint_url": task["endpoint_url"], "key": KEY, "secret": SECRET} if task["server"] == "s3" else {}
    transport = RemoteLocation(task["root_url"], storage_options=options, cache_dir=os.path.dirname(local)).transport()

    def read(url: str, size: int, byte_range: tuple[int, int] | None) -> int:
        if byte_range is None:
            transport.download_file(url, local, size=size)
            return size
        return len(transport.read_ranges(url, [byte_range], size=size)[0])

    return read


def _ceiling(task: dict[str, Any]) -> dict[str, Any]:
    """GETs per second and MB/s of `clients` threads, each with its own client, reading the objects in turn
    (whole, or one random `CEILING_RANGE_BYTES` range of each) for `CEILING_SECONDS`. Each client first reads
    one byte, so that connecting (and opening varstore's filesystem) is not timed."""
    objects = task["objects"]
    clock: dict[str, float] = {}

    def start_clock() -> None:
        clock["started"] = time.perf_counter()
        clock["deadline"] = clock["started"] + CEILING_SECONDS

    ready = threading.Barrier(task["clients"], action=start_clock)
    with tempfile.TemporaryDirectory() as scratch:
        readers = [_bare_reader(task) if task["client"] == "bare" else
                   _varstore_reader(task, os.path.join(scratch, f"object-{number}")) for number in range(task["clients"])]

        def loop(client_number: int) -> tuple[int, int]:
            read = readers[client_number]
            url, size = objects[client_number % len(objects)]
            read(url, size, (0, 1))
            ready.wait()
            choose = random.Random(client_number)
            requests = received = 0
            while time.perf_counter() < clock["deadline"]:
                url, size = objects[(client_number + requests) % len(objects)]
                start = choose.randrange(size - CEILING_RANGE_BYTES + 1)
                received += read(url, size, None if task["kind"] == "whole" else (start, start + CEILING_RANGE_BYTES))
                requests += 1
            return requests, received

        with ThreadPoolExecutor(task["clients"]) as pool:
            counts = list(pool.map(loop, range(task["clients"])))
        seconds = time.perf_counter() - clock["started"]
    requests, received = (sum(column) for column in zip(*counts))
    return {"requests": requests, "seconds": seconds, "requests_s": requests / seconds, "mb_s": received / seconds / 1e6}


def run_child(task: dict[str, Any]) -> dict[str, Any]:
    from bench.peers.base_remote import Remote
    from bench.workloads import cached_records

    if task["step"] == "ceiling":
        return _ceiling(task)
    peer = _load_peer(task["peer"])
    workload = _workload(task["scale"])
    if task["step"] == "write":
        started = time.perf_counter()
        peer.write(workload, task["directory"], SHARD_BYTES)
        return {"write_s": time.perf_counter() - started}
    remote = Remote(task["url"], task["endpoint_url"], KEY, SECRET, task["cache_dir"])
    expected = _fingerprint(cached_records(workload))
    if task["step"] in ("map", "map-blocks"):
        return _epoch(lambda: _map_loader(peer, remote, task["workers"], task["step"] == "map-blocks"), expected)
    shuffle = task["step"] == "stream"
    return _epoch(lambda: peer.stream(remote, BATCH, task["workers"], SEED, shuffle), expected)


def _describe(error: Exception) -> str:
    """The error's type, the first line of its message, the next line that names an error and the last line (a
    DataLoader worker's error wraps the worker's; litdata's obstore errors end with a debug dump)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    cause = [line for line in lines[1:] if "rror" in line][:1]
    text = " … ".join(dict.fromkeys(lines[:1] + cause + lines[-1:]))
    return f"{type(error).__name__}: {text}"[:500]


def child_main(task_json: str) -> None:
    task = json.loads(task_json)
    try:
        result = run_child(task)
    except Exception as error:
        traceback.print_exc()
        result = {"error": _describe(error)}
    Path(task["result"]).write_text(json.dumps(result, indent=1))


# The parent: the servers, the uploads, one child per step, the tables.


def _aws_environment(endpoint_url: str, no_files: Path) -> dict[str, str]:
    """Dummy keys and an endpoint on loopback; profiles, instance metadata and proxies out of reach."""
    environment_ = {name: value for name, value in os.environ.items()
                    if not name.startswith("AWS_") and name not in PROXY_VARIABLES}
    return {
        **environment_,
        "AWS_ACCESS_KEY_ID": KEY, "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": endpoint_url, "S3_ENDPOINT_URL": endpoint_url, "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_ALLOW_HTTP": "true",  # obstore (litdata's streaming reads) refuses http:// endpoints without it
        "AWS_CONFIG_FILE": str(no_files / "config"), "AWS_SHARED_CREDENTIALS_FILE": str(no_files / "credentials"),
    }


class Steps:
    """Runs one step of one peer in a fresh interpreter, logging to `logs/`, and returns its JSON result."""

    def __init__(self, out: Path, scale: float, workers: int, env: dict[str, str]) -> None:
        self.out, self.scale, self.workers, self.env = out, scale, workers, env
        self.logs = out / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)

    def __call__(self, name: str, task: dict[str, Any]) -> dict[str, Any]:
        result_path = self.logs / f"{name}.json"
        result_path.unlink(missing_ok=True)
        task = {**task, "scale": self.scale, "workers": self.workers, "result": str(result_path)}
        command = [sys.executable, "-m", "bench.remote", "--child", json.dumps(task)]
        env = {**self.env, "PYTHONPATH": str(ROOT / "tools"), "PYTHONWARNINGS": "ignore"}
        started = time.perf_counter()
        with open(self.logs / f"{name}.log", "w") as log:
            try:
                code = subprocess.run(command, env=env, stdout=log, stderr=subprocess.STDOUT,
                                      timeout=STEP_TIMEOUT_S).returncode
            except subprocess.TimeoutExpired:
                return {"error": f"timed out after {STEP_TIMEOUT_S} s; see logs/{name}.log"}
        print(f"  {name}: {time.perf_counter() - started:.1f} s", flush=True)
        if not result_path.exists():
            return {"error": f"exited with code {code} and no result; see logs/{name}.log"}
        return json.loads(result_path.read_text())


def _files(directory: Path) -> list[Path]:
    return sorted(path for path in directory.rglob("*") if path.is_file())


def _stored(directory: Path) -> dict[str, int]:
    files = _files(directory)
    return {"objects": len(files), "stored_bytes": sum(path.stat().st_size for path in files)}


def _upload(client: Any, directory: Path, prefix: str) -> None:
    """Every file under `directory` to s3://BUCKET/prefix/<relative path>."""
    for path in _files(directory):
        client.upload_file(str(path), BUCKET, f"{prefix}/{path.relative_to(directory).as_posix()}")


def _self_cpu() -> float:
    """CPU time of this process: moto and the proxies, which serve every request (and this harness)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _children_cpu() -> float:
    """CPU time of the finished children: a peer's process and its DataLoader workers."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


class NginxUnavailable(RuntimeError):
    """nginx is not installed here, or did not start."""


class Nginx:
    """nginx serving the files under `root` read-only (static files: GET and HEAD, with Range) on a free port of
    127.0.0.1: one worker process, sendfile, no access log; its configuration, pid and error log in `directory`.
    Not `tcp_nopush`: with it each 64 KiB ranged response here waited 40 ms (24 GET/s on one connection, 5,000
    without)."""

    def __init__(self, root: Path, directory: Path) -> None:
        self.root, self.directory = root, directory
        self.port = 0
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> Nginx:
        binary = shutil.which("nginx", path=f"{os.environ.get('PATH', '')}:/usr/sbin")
        if binary is None:
            raise NginxUnavailable("nginx is not installed (Debian: apt-get install nginx-light)")
        self.directory.mkdir(parents=True, exist_ok=True)
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        # As root, nginx's workers switch to `user`; this process's user can read what its children wrote.
        user = f"user {pwd.getpwuid(os.geteuid()).pw_name};" if os.geteuid() == 0 else ""
        temporary = " ".join(f"{name}_temp_path {self.directory / name};"
                             for name in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
        (self.directory / "nginx.conf").write_text(
            f"daemon off; worker_processes 1; {user} pid {self.directory / 'nginx.pid'};\n"
            f"error_log {self.directory / 'error.log'} warn;\nevents {{ worker_connections 1024; }}\n"
            f"http {{ access_log off; sendfile on; keepalive_requests 1000000; {temporary}\n"
            f"  default_type application/octet-stream;\n"
            f"  server {{ listen 127.0.0.1:{self.port}; root {self.root}; }} }}\n")
        self._process = subprocess.Popen(
            [binary, "-p", str(self.directory), "-c", str(self.directory / "nginx.conf"),
             "-e", str(self.directory / "error.log")], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + NGINX_START_TIMEOUT_S
        while self._process.poll() is None and time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=1):
                return self
            time.sleep(0.05)
        self.__exit__()
        log = self.directory / "error.log"
        raise NginxUnavailable(f"nginx did not start: {log.read_text().strip() if log.exists() else 'no error log'}")

    def __exit__(self, *exc_info: object) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            self._process.wait(NGINX_START_TIMEOUT_S)

    def cpu_seconds(self) -> float:
        """CPU time of the master process and its workers so far."""
        assert self._process is not None
        pid = self._process.pid
        children: list[str] = []
        with contextlib.suppress(OSError):
            children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        return sum(_process_cpu(int(process)) for process in [pid, *children])


def _process_cpu(pid: int) -> float:
    """User and system CPU seconds of a running process, from /proc (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Server:
    """A server of the benchmark, reached at `endpoint_url`: through its own counting, delaying proxy, or (nginx
    once more, for the ceilings only) directly, `proxy` None. Datasets live under `root_url` (s3://BUCKET, or the
    endpoint's http:// address); `cpu_seconds` is what the server and the proxies have spent."""

    kind: str  # "s3" or "http"
    label: str
    bare_client: str
    proxy: Any
    endpoint_url: str
    root_url: str
    cpu_seconds: Callable[[], float]

    def set_latency(self, latency_ms: float) -> None:
        if self.proxy is not None:
            self.proxy.clear_rules()
            if latency_ms:
                self.proxy.delay(latency_ms / 1000, times=None)


def _traffic(proxy: Any, samples: int, log: Path) -> dict[str, Any]:
    """Requests and response body bytes the proxy saw since its counters were cleared, total and per sample;
    the requests themselves go to `log` (JSON lines: method, path, range, status, body bytes)."""
    requests = proxy.requests()
    with open(log, "w") as stream:
        for request in requests:
            stream.write(json.dumps([request.method, request.path, request.range, request.status,
                                     request.body_bytes]) + "\n")
    gets = sum(1 for request in requests if request.method == "GET")
    received = sum(request.body_bytes for request in requests)
    per = max(samples, 1)
    return {"requests": len(requests), "get_requests": gets, "bytes_received": received,
            "requests_per_sample": len(requests) / per, "gets_per_sample": gets / per,
            "bytes_per_sample": received / per}


def write_peer(peer: str, steps: Steps, client: Any, data: Path, http_root: Path) -> dict[str, Any]:
    """Write `peer`'s dataset in a child process and put it where its server reads it: uploaded to moto (the
    local copy then removed) or left under nginx's root. Returns the write's time and what is stored."""
    directory = (http_root if peer in HTTP_PEERS else data) / peer
    written = steps(f"{peer}-write", {"step": "write", "peer": peer, "directory": str(directory)})
    if "error" in written:
        return {"error": f"write: {written['error']}"}
    result = {**written, **_stored(directory)}
    if peer not in HTTP_PEERS:
        _upload(client, directory, peer)
        shutil.rmtree(directory)
    return result


def write_ceiling_dataset(steps: Steps, client: Any, http_root: Path) -> list[tuple[str, int]]:
    """The varstore dataset the ceilings read, under CEILING_PREFIX on every server: its data objects (those
    that hold a `CEILING_RANGE_BYTES` range) as (path under the prefix, size)."""
    from varstore.format.header import DATA_SUFFIX

    directory = http_root / CEILING_PREFIX
    written = steps("ceiling-write", {"step": "write", "peer": "varstore", "directory": str(directory)})
    if "error" in written:
        raise SystemExit(f"remote: cannot write the ceilings' dataset: {written['error']}")
    _upload(client, directory, CEILING_PREFIX)
    return [(path.relative_to(directory).as_posix(), path.stat().st_size) for path in _files(directory)
            if path.name.endswith(DATA_SUFFIX) and path.stat().st_size >= CEILING_RANGE_BYTES]


def measure_ceilings(steps: Steps, servers: list[Server], objects: list[tuple[str, int]], tag: str) -> dict[str, Any]:
    """`CEILING_RUNS` on each server, with as many clients as the streams have workers."""
    ceilings: dict[str, Any] = {}
    for server in servers:
        root = f"{server.root_url}/{CEILING_PREFIX}"
        runs = {}
        for client, kind in CEILING_RUNS:
            task = {"step": "ceiling", "server": server.kind, "client": client, "kind": kind, "root_url": root,
                    "endpoint_url": server.endpoint_url, "objects": [[f"{root}/{name}", size] for name, size in objects],
                    "clients": max(1, steps.workers)}
            slug = server.label.replace(",", "").replace(" ", "-")
            runs[f"{client} {kind}"] = steps(f"ceiling-{slug}-{client}-{kind}-{tag}", task)
        ceilings[server.label] = {"bare_client": server.bare_client, "runs": runs}
    return ceilings


def measure_peer(peer: str, steps: Steps, server: Server, data: Path, tag: str, chosen: list[str]) -> dict[str, Any]:
    """Each `chosen` mode of `peer` in a fresh process with an empty cache directory, its traffic counted at the
    proxy."""
    modes = {}
    for mode in chosen:
        cache_dir = data / f"cache-{peer}-{mode}-{os.getpid()}"
        shutil.rmtree(cache_dir, ignore_errors=True)
        server.proxy.clear_counters()
        task = {"step": mode, "peer": peer, "url": f"{server.root_url}/{peer}", "endpoint_url": server.proxy.url,
                "cache_dir": str(cache_dir)}
        server_before, client_before = server.cpu_seconds(), _children_cpu()
        figures = steps(f"{peer}-{mode}-{tag}", task)
        figures.update(server_cpu_s=server.cpu_seconds() - server_before, client_cpu_s=_children_cpu() - client_before)
        figures.update(_traffic(server.proxy, figures.get("samples", 0), steps.logs / f"{peer}-{mode}-{tag}-requests.jsonl"))
        modes[mode] = figures
        shutil.rmtree(cache_dir, ignore_errors=True)
    return {"modes": modes}


def _load_average() -> str:
    with open("/proc/loadavg") as stream:
        return " ".join(stream.read().split()[:3])


def _cell(figures: dict[str, Any], name: str, format_: str) -> str:
    value = figures.get(name)
    return "–" if value is None else format(value, format_)


def _ceiling_table(ceilings: dict[str, Any], clients: int, notes: list[str], latency: str) -> list[str]:
    lines = [
        (f"Ceilings: {clients} threads of one process, a client each, GET the data objects of a varstore dataset "
         f"(shards of ~{SHARD_BYTES >> 20} MiB) in turn for {CEILING_SECONDS:g} s, whole or one random "
         f"{CEILING_RANGE_BYTES >> 10} KiB range at a time:"),
        "",
        ("| server | client | whole objects (GET/s) | whole objects (MB/s) | whole objects (MB/s per client) "
         "| 64 KiB ranges (GET/s) | 64 KiB ranges (MB/s) |"),
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for server, measured in ceilings.items():
        for client, label in (("bare", measured["bare_client"]), ("varstore", "varstore's transport")):
            whole, ranged = measured["runs"][f"{client} whole"], measured["runs"][f"{client} range"]
            for kind, figures in (("whole objects", whole), ("64 KiB ranges", ranged)):
                if "error" in figures:
                    notes.append(f"- ceiling, {server}, {label}, {kind}, {latency}: {figures['error']}")
            per_client = "–" if "error" in whole else f"{whole['mb_s'] / clients:,.0f}"
            lines.append(f"| {server} | {label} | {_cell(whole, 'requests_s', ',.0f')} | {_cell(whole, 'mb_s', ',.0f')} "
                         f"| {per_client} | {_cell(ranged, 'requests_s', ',.0f')} | {_cell(ranged, 'mb_s', ',.1f')} |")
    return lines


def _peer_rows(results: dict[str, Any], run: dict[str, Any], notes: list[str], latency: str) -> list[str]:
    processes = max(1, results["meta"]["workers"])
    lines = []
    for peer, written in results["peers"].items():
        label = LABELS[peer]
        if "error" in written:
            lines.append(f"| {label} | – |{' – |' * 10} failed |")
            continue
        for mode, figures in run["peers"][peer]["modes"].items():
            epoch = MODES[mode]
            if "error" in figures:
                lines.append(f"| {label} | {epoch} |{' – |' * 10} failed |")
                notes.append(f"- {label}, {epoch}, {latency}: {figures['error']}")
                continue
            check = figures["check"].partition(":")[0]
            # Bytes over the dataset's stored size, for a whole epoch only.
            amplification = f"{figures['bytes_received'] / written['stored_bytes']:.2f}" if check == "ok" else "–"
            if check != "ok":
                notes.append(f"- {label}, {epoch}, {latency}: {figures['check']}")
            per_process = figures["bytes_received"] / figures["epoch_s"] / processes / 1e6
            lines.append(
                f"| {label} | {epoch} | {_cell(figures, 'samples_s', ',.0f')} | {per_process:.1f} "
                f"| {_cell(figures, 'epoch_s', '.2f')} "
                f"| {_cell(figures, 'first_batch_s', '.2f')} | {_cell(figures, 'open_s', '.2f')} "
                f"| {_cell(figures, 'requests_per_sample', '.3f')} | {_cell(figures, 'gets_per_sample', '.3f')} "
                f"| {figures['bytes_per_sample'] / 1024:.1f} | {amplification} "
                f"| {_cell(figures, 'server_cpu_s', '.1f')} | {check} |")
    return lines


def table(results: dict[str, Any]) -> str:
    meta = results["meta"]
    lines = [
        f"Remote datasets: {meta['records']:,} records of the \"{WORKLOAD}\" workload "
        f"({meta['payload_bytes'] / 1e6:.1f} MB), shards of ~{SHARD_BYTES >> 20} MiB, moto S3 (and nginx, for the "
        f"http:// peer) on 127.0.0.1 behind a proxy adding the latency named above each table to every request; "
        f"DataLoader batch {BATCH}, {meta['workers']} workers; empty cache per epoch.",
    ]
    notes = [f"- {LABELS[peer]}: {written['error']}" for peer, written in results["peers"].items() if "error" in written]
    for run in results["runs"]:
        latency = f"{run['latency_ms']:g} ms"
        lines += ["", f"### {latency} per request", ""]
        lines += _ceiling_table(run["ceilings"], max(1, meta["workers"]), notes, latency)
        lines += [
            "",
            ("| peer | epoch | samples/s | MB/s per process | epoch (s) | first batch (s) | open (s) "
             "| requests/sample | GETs/sample | KB/sample | read / stored | server CPU (s) | check |"),
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
        ]
        lines += _peer_rows(results, run, notes, latency)
    lines += ["", f"Load average before / after: {meta['load_before']} / {meta['load_after']}; "
              f"{meta['minutes']:.1f} min; `{meta['command']}`."]
    return "\n".join(lines + ([""] + notes if notes else [])) + "\n"


def main() -> int:
    arguments = _arguments()
    if arguments.child:
        child_main(arguments.child)
        return 0
    environment.run_in_bench_venv(__file__)
    sys.path.insert(0, str(ROOT))  # tests/helpers_fault_proxy.py
    import logging

    import boto3
    from moto.server import ThreadedMotoServer

    from tests.helpers_fault_proxy import FaultProxy

    peers = arguments.peers.split(",") if arguments.peers else list(REMOTE_PEERS)
    out = Path(arguments.out).resolve()
    data = out / "data"
    http_root = data / "served"
    shutil.rmtree(data, ignore_errors=True)
    (data / "no-aws-files").mkdir(parents=True)
    http_root.mkdir()
    workload = _workload(arguments.scale)
    started, load_before = time.time(), _load_average()
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    moto.start()
    try:
        host, port = moto.get_host_and_port()
        moto_url = f"http://{host}:{port}"
        os.environ.clear()
        os.environ.update(_aws_environment(moto_url, data / "no-aws-files"))
        client = boto3.client("s3", endpoint_url=moto_url)
        client.create_bucket(Bucket=BUCKET)
        with contextlib.ExitStack() as stack:
            s3_proxy = stack.enter_context(FaultProxy(moto_url))
            servers = [Server("s3", "moto S3", "boto3", s3_proxy, s3_proxy.url, f"s3://{BUCKET}", _self_cpu)]
            try:
                nginx = stack.enter_context(Nginx(http_root, out / "nginx"))
            except NginxUnavailable as error:
                nginx_error = str(error)
            else:
                nginx_error = None
                http_proxy = stack.enter_context(FaultProxy(nginx.url))
                servers += [Server("http", "nginx", "http.client", http_proxy, http_proxy.url, http_proxy.url,
                                   lambda: _self_cpu() + nginx.cpu_seconds()),
                            Server("http", "nginx, no proxy", "http.client", None, nginx.url, nginx.url, nginx.cpu_seconds)]
            steps = Steps(out, arguments.scale, arguments.workers, _aws_environment(s3_proxy.url, data / "no-aws-files"))
            ceiling_objects = write_ceiling_dataset(steps, client, http_root)
            results: dict[str, Any] = {"peers": {}, "runs": []}
            for peer in peers:
                print(f"{peer}:", flush=True)
                if peer in HTTP_PEERS and nginx_error is not None:
                    results["peers"][peer] = {"error": nginx_error}
                else:
                    results["peers"][peer] = write_peer(peer, steps, client, data, http_root)
            for latency in arguments.latency_ms:
                tag = f"{latency:g}ms"
                print(f"{tag}:", flush=True)
                for server in servers:
                    server.set_latency(latency)
                run: dict[str, Any] = {"latency_ms": latency, "peers": {},
                                       "ceilings": measure_ceilings(steps, servers, ceiling_objects, tag)}
                for peer, written in results["peers"].items():
                    if "error" not in written:
                        server = servers[1] if peer in HTTP_PEERS else servers[0]
                        run["peers"][peer] = measure_peer(peer, steps, server, data, tag, arguments.modes)
                results["runs"].append(run)
    finally:
        moto.stop()
    shutil.rmtree(data, ignore_errors=True)
    results["meta"] = {
        "command": " ".join(["python3", "tools/bench/remote.py", *sys.argv[1:]]),
        "records": workload.count, "payload_bytes": workload.payload_bytes, "shard_bytes": SHARD_BYTES,
        "batch": BATCH, "workers": arguments.workers, "latencies_ms": arguments.latency_ms,
        "load_before": load_before, "load_after": _load_average(), "minutes": (time.time() - started) / 60,
    }
    (out / "results.json").write_text(json.dumps(results, indent=1))
    text = table(results)
    (out / "results.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

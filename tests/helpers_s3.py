"""A real S3 server for the tests: moto's standalone server on 127.0.0.1, one per test session.

    def test_x(s3_server):
        bucket = s3_server.new_bucket()
        fs, path = open_filesystem(f"s3://{bucket}/key", s3_server.storage_options)
        ...
        assert len(s3_server.requests(bucket, method="GET")) == 1

The session runs with dummy AWS credentials and every other AWS_* variable (profiles, tokens, instance
metadata, config files) removed or disabled, and AWS_ENDPOINT_URL pointing at the loopback server, so no
client in a test can reach an address off this machine. Every request the server answers is logged
(method, bucket, key, Range header, status) so tests can count what a client fetched.
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

import pytest

_PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")


@dataclass(frozen=True)
class S3Request:
    """One request the server answered; `range` is the Range header, if any."""

    method: str
    bucket: str
    key: str
    range: str | None
    status: int


class _RequestLog:
    """WSGI middleware in front of moto's app that records every request it answers."""

    def __init__(self, app: Callable[..., Iterable[bytes]]) -> None:
        self._app = app
        self._lock = threading.Lock()
        self.entries: list[S3Request] = []

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        bucket, _, key = environ.get("PATH_INFO", "").lstrip("/").partition("/")

        def logging_start_response(status: str, headers: Any, *rest: Any) -> Any:
            request = S3Request(environ["REQUEST_METHOD"], bucket, key, environ.get("HTTP_RANGE"), int(status[:3]))
            with self._lock:
                self.entries.append(request)
            return start_response(status, headers, *rest)

        return self._app(environ, logging_start_response)

    def snapshot(self) -> list[S3Request]:
        with self._lock:
            return list(self.entries)


class S3Server:
    """The running server: where it listens, how s3fs reaches it, fresh buckets and the request log."""

    def __init__(self, endpoint_url: str, log: _RequestLog, client: Any) -> None:
        self.endpoint_url = endpoint_url
        self._log = log
        self._client = client

    @property
    def storage_options(self) -> dict[str, Any]:
        """s3fs's options for this server (a fresh dict each time: callers may extend it)."""
        return {"endpoint_url": self.endpoint_url, "key": "testing", "secret": "testing"}

    def new_bucket(self) -> str:
        """Create an empty bucket no other test uses and return its name."""
        name = f"varstore-test-{secrets.token_hex(6)}"
        self._client.create_bucket(Bucket=name)
        return name

    def requests(self, bucket: str, *, method: str | None = None, key: str | None = None) -> list[S3Request]:
        """The requests answered so far for `bucket`, optionally only those with `method` and/or `key`."""
        return [
            entry
            for entry in self._log.snapshot()
            if entry.bucket == bucket and method in (None, entry.method) and key in (None, entry.key)
        ]


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """moto's S3 on 127.0.0.1 with a free port, started once per session (on first use) and stopped after it."""
    pytest.importorskip("moto.server", reason="the S3 tests need the dev extra: pip install -e '.[dev]'")
    import boto3
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one INFO line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        # ThreadedMotoServer has no hook for middleware: wrap the app of its werkzeug server before any request.
        log = _RequestLog(server._server.app)  # type: ignore[union-attr]
        server._server.app = log  # type: ignore[union-attr]
        host, port = server.get_host_and_port()
        endpoint_url = f"http://{host}:{port}"
        no_files = tmp_path_factory.mktemp("aws-config")
        with pytest.MonkeyPatch.context() as patch:
            for name in [name for name in os.environ if name.startswith("AWS_")] + list(_PROXY_VARIABLES):
                patch.delenv(name, raising=False)
            patch.setenv("AWS_ACCESS_KEY_ID", "testing")
            patch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
            patch.setenv("AWS_DEFAULT_REGION", "us-east-1")
            patch.setenv("AWS_ENDPOINT_URL", endpoint_url)
            patch.setenv("AWS_EC2_METADATA_DISABLED", "true")
            patch.setenv("AWS_CONFIG_FILE", str(no_files / "config"))
            patch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(no_files / "credentials"))
            client = boto3.client("s3", endpoint_url=endpoint_url)
            yield S3Server(endpoint_url, log, client)
    finally:
        server.stop()


@pytest.fixture
def node_cache(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A node cache (and the remote writer's staging) per test, under the test's own directory: a module asks for
    it with ``pytestmark = pytest.mark.usefixtures("node_cache")``."""
    cache = tmp_path / "node-cache"
    monkeypatch.setenv("VARSTORE_CACHE_DIR", str(cache))
    return cache

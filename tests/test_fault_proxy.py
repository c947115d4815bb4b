"""The fault-injecting proxy (tests/helpers_fault_proxy.py): each fault as a plain HTTP client sees it, exact
request and byte counts, rules that expire, Range and keep-alive pass-through, concurrent clients, a clean stop.

The upstream here is a tiny stdlib HTTP server started by the test; the last test puts the proxy in front of
moto's S3 server (the session's `s3_server`, tests/helpers_s3.py) and watches s3fs retry a 503 (skipped
when s3fs or moto is not installed).
"""

from __future__ import annotations

import concurrent.futures
import http.client
import http.server
import threading
import time
import urllib.error
import urllib.request
from typing import Any, Callable, Iterator

import pytest

from tests.helpers_fault_proxy import SLOW_DOWN_BODY, FaultProxy, fault_proxy  # noqa: F401 - fault_proxy is a fixture

OBJECTS = {
    "/bucket/small": b"hello, proxy",
    "/bucket/large": bytes(range(256)) * 1024,  # 256 KiB: several stream chunks
}
CHUNKED_PATH = "/bucket/chunked"
CHUNKED_PARTS = [b"first part, ", b"second part, ", b"last part"]


class _Upstream(http.server.BaseHTTPRequestHandler):
    """Serves OBJECTS (with single `bytes=a-b` ranges), a chunked body at CHUNKED_PATH, and stores PUTs."""

    protocol_version = "HTTP/1.1"
    objects: dict[str, bytes]

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
        pass

    def do_GET(self) -> None:
        if self.path == CHUNKED_PATH:
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for part in CHUNKED_PARTS:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
            self.wfile.write(b"0\r\n\r\n")
            return
        body = self.objects.get(self.path)
        if body is None:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        requested = self.headers.get("Range")
        if requested is not None:
            first, last = (int(part) for part in requested.removeprefix("bytes=").split("-"))
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {first}-{last}/{len(body)}")
            body = body[first:last + 1]
        else:
            self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_HEAD = do_GET

    def do_PUT(self) -> None:
        self.objects[self.path] = self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()


@pytest.fixture
def upstream() -> Iterator[tuple[str, dict[str, bytes]]]:
    """A stdlib HTTP server on loopback: (url, its objects). Its threads are joined at teardown."""
    objects = dict(OBJECTS)
    handler = type("Upstream", (_Upstream,), {"objects": objects})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = False  # server_close joins every handler thread
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", objects
    finally:
        server.shutdown()
        thread.join(10)
        server.server_close()
        assert not thread.is_alive()


@pytest.fixture
def proxy(upstream: tuple[str, dict[str, bytes]], fault_proxy: Callable[[str], FaultProxy]) -> FaultProxy:
    return fault_proxy(upstream[0])


def _connect(proxy: FaultProxy) -> http.client.HTTPConnection:
    host, port = proxy.url.removeprefix("http://").split(":")
    return http.client.HTTPConnection(host, int(port), timeout=30)


def _get(proxy: FaultProxy, path: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    connection = _connect(proxy)
    try:
        connection.request("GET", path, headers=headers or {})
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def test_forwarded_get_returns_the_upstream_body_and_is_counted_with_its_bytes(proxy: FaultProxy) -> None:
    assert _get(proxy, "/bucket/large") == (200, OBJECTS["/bucket/large"])
    assert _get(proxy, "/bucket/small") == (200, OBJECTS["/bucket/small"])
    assert _get(proxy, "/bucket/missing")[0] == 404
    assert proxy.count() == 3
    assert proxy.count("GET", "/bucket/large") == 1
    assert proxy.bytes_sent("GET", "/bucket/large") == len(OBJECTS["/bucket/large"])
    assert proxy.bytes_sent() == len(OBJECTS["/bucket/large"]) + len(OBJECTS["/bucket/small"])
    assert [(r.path, r.status, r.fault) for r in proxy.requests()] == [
        ("/bucket/large", 200, None), ("/bucket/small", 200, None), ("/bucket/missing", 404, None)
    ]


def test_reset_aborts_the_connection_once_then_the_rule_is_spent(proxy: FaultProxy) -> None:
    rule = proxy.reset()
    with pytest.raises(ConnectionResetError) as reset:
        _get(proxy, "/bucket/small")
    # An RST (SO_LINGER 0), not a clean close: http.client's RemoteDisconnected would mean a FIN arrived.
    assert not isinstance(reset.value, http.client.RemoteDisconnected)
    assert _get(proxy, "/bucket/small") == (200, OBJECTS["/bucket/small"])
    assert (rule.fired, rule.remaining) == (1, 0)
    assert [(r.status, r.fault, r.body_bytes) for r in proxy.requests()] == [
        (None, "reset", 0), (200, None, len(OBJECTS["/bucket/small"]))
    ]


def test_slow_down_answers_503_with_s3_xml_and_keeps_the_connection_alive(proxy: FaultProxy) -> None:
    proxy.slow_down()
    connection = _connect(proxy)
    try:
        connection.request("GET", "/bucket/small")
        response = connection.getresponse()
        body = response.read()
        assert response.status == 503
        assert response.getheader("Content-Type") == "application/xml"
        assert b"<Code>SlowDown</Code>" in body
        connection.request("GET", "/bucket/small")  # same socket: the 503 did not end it
        response = connection.getresponse()
        assert (response.status, response.read()) == (200, OBJECTS["/bucket/small"])
    finally:
        connection.close()
    assert proxy.count("GET", "/bucket/small") == 2


def test_server_error_answers_500_with_s3_internal_error_xml(proxy: FaultProxy) -> None:
    proxy.server_error(method="GET")
    status, body = _get(proxy, "/bucket/small")
    assert status == 500
    assert b"<Code>InternalError</Code>" in body
    assert [(r.status, r.fault) for r in proxy.requests()] == [(500, "server_error")]


def test_truncate_keeps_the_content_length_so_the_client_gets_an_incomplete_read(proxy: FaultProxy) -> None:
    proxy.truncate(after_bytes=100_000)
    connection = _connect(proxy)
    try:
        connection.request("GET", "/bucket/large")
        response = connection.getresponse()
        assert response.getheader("Content-Length") == str(len(OBJECTS["/bucket/large"]))
        with pytest.raises(http.client.IncompleteRead) as short:
            response.read()
    finally:
        connection.close()
    assert short.value.partial == OBJECTS["/bucket/large"][:100_000]
    assert proxy.bytes_sent() == 100_000
    assert _get(proxy, "/bucket/large") == (200, OBJECTS["/bucket/large"])


def test_delay_holds_the_request_at_least_that_long(proxy: FaultProxy) -> None:
    proxy.delay(0.2, path="/bucket/small")
    started = time.monotonic()
    assert _get(proxy, "/bucket/small") == (200, OBJECTS["/bucket/small"])
    assert time.monotonic() - started >= 0.2
    assert proxy.requests()[0].delayed == 0.2


def test_a_standing_delay_combines_with_a_failure_rule(proxy: FaultProxy) -> None:
    latency = proxy.delay(0.05, times=None)
    proxy.slow_down()
    started = time.monotonic()
    assert _get(proxy, "/bucket/small")[0] == 503
    assert _get(proxy, "/bucket/small")[0] == 200
    assert time.monotonic() - started >= 0.1
    assert (latency.fired, latency.remaining) == (2, None)


def test_rules_expire_after_their_count(proxy: FaultProxy) -> None:
    rule = proxy.slow_down(times=3)
    statuses = []
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # no HTTP_PROXY from the environment
    for _ in range(5):
        try:
            with opener.open(proxy.url + "/bucket/small", timeout=30) as response:
                statuses.append(response.status)
        except urllib.error.HTTPError as error:
            statuses.append(error.code)
            error.close()
    assert statuses == [503, 503, 503, 200, 200]
    assert (rule.fired, rule.remaining) == (3, 0)
    assert proxy.count() == 5


def test_rules_apply_only_to_the_method_and_path_they_name(proxy: FaultProxy) -> None:
    by_path = proxy.server_error(times=None, method="GET", path="/bucket/large")
    by_predicate = proxy.reset(times=None, path=lambda path: path.endswith("/missing"))
    assert _get(proxy, "/bucket/small")[0] == 200
    assert _get(proxy, "/bucket/large")[0] == 500
    connection = _connect(proxy)
    try:
        connection.request("HEAD", "/bucket/large")
        response = connection.getresponse()
        response.read()
        assert (response.status, response.getheader("Content-Length")) == (200, str(len(OBJECTS["/bucket/large"])))
    finally:
        connection.close()
    with pytest.raises(ConnectionResetError):
        _get(proxy, "/bucket/missing")
    assert (by_path.fired, by_predicate.fired) == (1, 1)
    proxy.remove(by_path)
    assert _get(proxy, "/bucket/large")[0] == 200
    assert proxy.count("HEAD") == 1 and proxy.count("GET") == 4


def test_range_requests_pass_through(proxy: FaultProxy) -> None:
    connection = _connect(proxy)
    try:
        connection.request("GET", "/bucket/large", headers={"Range": "bytes=1000-1999"})
        response = connection.getresponse()
        assert response.status == 206
        assert response.getheader("Content-Range") == f"bytes 1000-1999/{len(OBJECTS['/bucket/large'])}"
        assert response.read() == OBJECTS["/bucket/large"][1000:2000]
    finally:
        connection.close()
    [record] = proxy.requests()
    assert (record.range, record.status, record.body_bytes) == ("bytes=1000-1999", 206, 1000)


def test_one_keep_alive_connection_carries_chunked_bodies_both_ways(
    proxy: FaultProxy, upstream: tuple[str, dict[str, bytes]]
) -> None:
    connection = _connect(proxy)
    try:
        connection.request("PUT", "/bucket/uploaded", body=iter([b"abc", b"defg", b""]), encode_chunked=True,
                           headers={"Transfer-Encoding": "chunked"})
        response = connection.getresponse()
        assert (response.status, response.read()) == (200, b"")
        connection.request("GET", CHUNKED_PATH)
        response = connection.getresponse()
        assert (response.status, response.read()) == (200, b"".join(CHUNKED_PARTS))
        connection.request("GET", "/bucket/uploaded?versionId=1")
        response = connection.getresponse()
        assert (response.status, response.read()) == (404, b"")  # the query reaches upstream
        connection.request("GET", "/bucket/uploaded")
        response = connection.getresponse()
        assert (response.status, response.read()) == (200, b"abcdefg")
    finally:
        connection.close()
    assert upstream[1]["/bucket/uploaded"] == b"abcdefg"
    assert [(r.method, r.path, r.query) for r in proxy.requests()] == [
        ("PUT", "/bucket/uploaded", ""), ("GET", CHUNKED_PATH, ""),
        ("GET", "/bucket/uploaded", "versionId=1"), ("GET", "/bucket/uploaded", ""),
    ]


def test_concurrent_clients_are_served_and_counted_exactly(proxy: FaultProxy) -> None:
    proxy.slow_down(times=5, path="/bucket/large")
    paths = ["/bucket/small", "/bucket/large"] * 20

    def fetch(path: str) -> int:
        return _get(proxy, path)[0]

    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        statuses = list(pool.map(fetch, paths))
    assert statuses.count(503) == 5 and statuses.count(200) == 35
    assert proxy.count("GET", "/bucket/small") == 20
    assert proxy.count("GET", "/bucket/large") == 20
    assert proxy.bytes_sent(path="/bucket/large") == 15 * len(OBJECTS["/bucket/large"]) + 5 * len(SLOW_DOWN_BODY)


def test_stop_ends_idle_keep_alive_connections_and_pending_delays(upstream: tuple[str, dict[str, bytes]]) -> None:
    proxy = FaultProxy(upstream[0]).start()
    idle = _connect(proxy)
    idle.request("GET", "/bucket/small")
    assert idle.getresponse().read() == OBJECTS["/bucket/small"]  # the connection now waits, open
    proxy.delay(120)
    outcome: list[BaseException | int] = []

    def delayed_client() -> None:
        try:
            outcome.append(_get(proxy, "/bucket/small")[0])
        except (ConnectionError, http.client.HTTPException) as error:
            outcome.append(error)

    client = threading.Thread(target=delayed_client)
    client.start()
    deadline = time.monotonic() + 30
    while proxy.count() < 2:  # the delayed request has reached the proxy
        assert time.monotonic() < deadline
        time.sleep(0.01)
    proxy.stop()  # raises if a proxy thread is still alive after its join timeout
    client.join(30)
    idle.close()
    assert not client.is_alive()
    assert isinstance(outcome[0], ConnectionError)
    assert not [thread for thread in threading.enumerate() if thread.name.startswith("fault-proxy")]


def test_upstream_must_be_a_loopback_http_address() -> None:
    for url in ("http://example.com:80", "https://127.0.0.1:443", "http://127.0.0.1", "http://10.0.0.1:9000"):
        with pytest.raises(ValueError, match="loopback"):
            FaultProxy(url)


def test_s3fs_through_the_proxy_retries_a_slow_down_from_moto(
    s3_server: Any, fault_proxy: Callable[[str], FaultProxy]
) -> None:
    s3fs = pytest.importorskip("s3fs")
    proxy = fault_proxy(s3_server.endpoint_url)
    bucket = s3_server.new_bucket()
    fs = s3fs.S3FileSystem(**{**s3_server.storage_options, "endpoint_url": proxy.url}, skip_instance_cache=True)
    payload = bytes(range(256)) * 64
    fs.pipe_file(f"{bucket}/object", payload)
    proxy.clear_counters()
    rule = proxy.slow_down(times=2, method="GET", path=f"/{bucket}/object")
    assert fs.cat_file(f"{bucket}/object") == payload
    # botocore retried the two 503s itself; they never reached moto, which answered one GET.
    assert rule.fired == 2
    assert [(r.status, r.fault) for r in proxy.requests() if r.method == "GET"] == [
        (503, "slow_down"), (503, "slow_down"), (200, None)
    ]
    assert proxy.bytes_sent("GET", f"/{bucket}/object") == len(payload) + 2 * len(SLOW_DOWN_BODY)
    assert [r.status for r in s3_server.requests(bucket, method="GET", key="object")] == [200]

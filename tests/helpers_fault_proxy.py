"""A fault-injecting HTTP proxy on loopback, for tests of remote storage (stdlib only).

`FaultProxy(upstream_url)` listens on 127.0.0.1 (a free port) and forwards every request to an HTTP server
on this machine (moto's S3 server in the remote tests). Rules set at runtime, from any thread, make the
next N matching requests fail the way object stores (and the networks and middleboxes in front of them)
fail: a connection reset, a `503 SlowDown`, a `500`, any S3 error answer (`error`: a `403
InvalidAccessKeyId`, say), a body cut short under its full Content-Length, a body with one bit flipped
(`damage`), a body sent a few bytes at a time (`trickle`), a Range header ignored (`ignore_range`: the
whole object comes back), or a delay. It logs every request (method, path, Range, status, fault, body
bytes sent), so a test can assert "each object was downloaded once" or "a random read costs two
requests" exactly.

It is a request/response proxy, not a byte pipe: it reads one whole request (Content-Length or chunked body),
sends it upstream on a fresh connection with http.client, and streams the response back. Client connections
are HTTP/1.1 keep-alive; Range requests pass through untouched (but under `ignore_range`).

    with FaultProxy("http://127.0.0.1:5000") as proxy:
        proxy.slow_down(times=2, method="GET")
        ... client with endpoint_url=proxy.url ...
        assert proxy.count("GET", "/bucket/key") == 3

Tests use the `fault_proxy` fixture: `proxy = fault_proxy(upstream_url)`, stopped at teardown.
"""

from __future__ import annotations

import dataclasses
import http.client
import socket
import socketserver
import struct
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler
from typing import Callable, Iterator, Optional, Union

import pytest

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
# Headers that describe one hop, not the message: never forwarded (RFC 9110 section 7.6.1), plus
# Expect, which this proxy answers itself (it sends `100 Continue` and forwards the whole body at once).
HOP_BY_HOP_HEADERS = frozenset(
    {"connection", "keep-alive", "proxy-connection", "proxy-authenticate", "proxy-authorization", "te",
     "trailer", "transfer-encoding", "upgrade", "expect"}
)
STREAM_CHUNK_BYTES = 64 * 1024
JOIN_TIMEOUT_SECONDS = 10.0
# A client that keeps an idle connection open longer than this is dropped, so no handler thread waits forever.
IDLE_CONNECTION_TIMEOUT_SECONDS = 60.0

SLOW_DOWN_BODY = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n'
    b"<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message>"
    b"<RequestId>fault-proxy</RequestId></Error>"
)
INTERNAL_ERROR_BODY = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n'
    b"<Error><Code>InternalError</Code><Message>We encountered an internal error. Please try again.</Message>"
    b"<RequestId>fault-proxy</RequestId></Error>"
)

# A path filter: an exact path (no query string), a predicate on the path, or None for any path.
PathMatcher = Optional[Union[str, Callable[[str], bool]]]


def _matches(method_filter: str | None, path_filter: PathMatcher, method: str, path: str) -> bool:
    if method_filter is not None and method_filter != method:
        return False
    if path_filter is None:
        return True
    return path_filter(path) if callable(path_filter) else path_filter == path


@dataclasses.dataclass
class RequestRecord:
    """One request the proxy received. `path` excludes the query string; `fault` names the failure rule
    applied (None if forwarded untouched); `status` is None when the connection was reset before a status
    line; `body_bytes` counts response body bytes written to the client (synthesised error bodies too)."""

    method: str
    path: str
    query: str
    range: str | None
    status: int | None = None
    fault: str | None = None
    delayed: float = 0.0
    body_bytes: int = 0


@dataclasses.dataclass
class Rule:
    """A fault applied to the next `remaining` requests that match `method` and `path` (None: every request;
    `remaining` None: until removed). `fired` counts the requests it has been applied to."""

    fault: str
    method: str | None
    path: PathMatcher
    remaining: int | None
    after_bytes: int = 0
    seconds: float = 0.0
    status: int = 0
    code: str = ""
    message: str = ""
    fired: int = 0

    def matches(self, method: str, path: str) -> bool:
        return self.remaining != 0 and _matches(self.method, self.path, method, path)


class FaultProxy:
    """A loopback HTTP proxy in front of `upstream_url` that injects faults by rule and logs every request.

    Failure rules (`reset`, `slow_down`, `server_error`, `error`, `truncate`, `damage`, `trickle`,
    `ignore_range`) are tried in the order they were added
    and at most one applies to a request; every matching `delay` rule also applies (delays add up), so a
    standing latency combines with occasional failures. A rule's count is taken when a request matches it."""

    def __init__(self, upstream_url: str) -> None:
        parsed = urllib.parse.urlsplit(upstream_url)
        if parsed.scheme != "http" or parsed.hostname not in LOOPBACK_HOSTS or parsed.port is None:
            raise ValueError(f"upstream must be http://<loopback host>:<port>, got {upstream_url!r}")
        self.upstream_host: str = parsed.hostname
        self.upstream_port: int = parsed.port
        self._lock = threading.Lock()
        self._rules: list[Rule] = []
        self._records: list[RequestRecord] = []
        self._stopping = threading.Event()
        self._server = _ProxyServer(self)
        self._serve_thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """The proxy's address, e.g. `http://127.0.0.1:40123`: give it to the client as its endpoint."""
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    # Lifecycle

    def start(self) -> FaultProxy:
        self._serve_thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name="fault-proxy", daemon=True
        )
        self._serve_thread.start()
        return self

    def stop(self) -> None:
        """Stop accepting, cut open client connections and delays short, and join every thread. A thread
        still alive after the join timeout is an error: the proxy must not leak threads into later tests."""
        self._stopping.set()
        if self._serve_thread is not None:
            self._server.shutdown()
            self._serve_thread.join(JOIN_TIMEOUT_SECONDS)
        self._server.server_close()
        stuck = self._server.close_connections_and_join(JOIN_TIMEOUT_SECONDS)
        if self._serve_thread is not None and self._serve_thread.is_alive():
            stuck.append(self._serve_thread)
        if stuck:
            raise RuntimeError(f"fault proxy threads still running after {JOIN_TIMEOUT_SECONDS} s: {stuck}")

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # Rules

    def reset(self, *, times: int | None = 1, method: str | None = None, path: PathMatcher = None) -> Rule:
        """Read the request, then close the client connection with an RST (SO_LINGER 0), sending nothing."""
        return self._add(Rule("reset", method, path, times))

    def slow_down(self, *, times: int | None = 1, method: str | None = None, path: PathMatcher = None) -> Rule:
        """Answer `503 Slow Down` with S3's `SlowDown` error XML instead of forwarding."""
        return self._add(Rule("slow_down", method, path, times))

    def server_error(self, *, times: int | None = 1, method: str | None = None, path: PathMatcher = None) -> Rule:
        """Answer `500 Internal Server Error` with S3's `InternalError` XML instead of forwarding."""
        return self._add(Rule("server_error", method, path, times))

    def truncate(
        self, after_bytes: int, *, times: int | None = 1, method: str | None = None, path: PathMatcher = None
    ) -> Rule:
        """Forward, send the upstream status and headers (Content-Length unchanged) and the first
        `after_bytes` of the body, then close the connection: the client sees a short read."""
        if after_bytes < 0:
            raise ValueError(f"after_bytes must be >= 0, got {after_bytes}")
        return self._add(Rule("truncate", method, path, times, after_bytes=after_bytes))

    def error(
        self, status: int, code: str, message: str = "refused by the fault proxy", *, times: int | None = 1,
        method: str | None = None, path: PathMatcher = None,
    ) -> Rule:
        """Answer `status` with S3's error XML carrying `code` (`InvalidAccessKeyId`, `AccessDenied`,
        `NoSuchBucket`...) and `message`, instead of forwarding."""
        return self._add(Rule("error", method, path, times, status=status, code=code, message=message))

    def damage(
        self, at_byte: int = 0, *, times: int | None = 1, method: str | None = None, path: PathMatcher = None
    ) -> Rule:
        """Forward, and flip the low bit of body byte `at_byte` (if the body is that long) on the way back:
        the right length and headers, the wrong bytes (what a checksum catches)."""
        if at_byte < 0:
            raise ValueError(f"at_byte must be >= 0, got {at_byte}")
        return self._add(Rule("damage", method, path, times, after_bytes=at_byte))

    def trickle(
        self, seconds: float, *, chunk_bytes: int = 1, times: int | None = 1, method: str | None = None,
        path: PathMatcher = None,
    ) -> Rule:
        """Forward, send the status and headers at once, then the body `chunk_bytes` at a time, waiting
        `seconds` before each chunk: a response that never stalls long enough for a socket timeout yet takes
        (body bytes / chunk_bytes) x seconds to arrive. `stop` cuts the wait short."""
        if seconds < 0 or chunk_bytes < 1:
            raise ValueError(f"need seconds >= 0 and chunk_bytes >= 1, got {seconds}, {chunk_bytes}")
        return self._add(Rule("trickle", method, path, times, after_bytes=chunk_bytes, seconds=seconds))

    def ignore_range(self, *, times: int | None = 1, method: str | None = None, path: PathMatcher = None) -> Rule:
        """Forward without the request's Range header, as a server (or a cache in front of it) that ignores
        Range does: the client asked for some bytes and gets `200` with the whole object."""
        return self._add(Rule("ignore_range", method, path, times))

    def delay(
        self, seconds: float, *, times: int | None = 1, method: str | None = None, path: PathMatcher = None
    ) -> Rule:
        """Wait `seconds` after reading the request, before forwarding it (or applying a failure rule)."""
        if seconds < 0:
            raise ValueError(f"seconds must be >= 0, got {seconds}")
        return self._add(Rule("delay", method, path, times, seconds=seconds))

    def remove(self, rule: Rule) -> None:
        with self._lock:
            self._rules.remove(rule)

    def clear_rules(self) -> None:
        with self._lock:
            self._rules.clear()

    def _add(self, rule: Rule) -> Rule:
        if rule.remaining is not None and rule.remaining < 1:
            raise ValueError(f"times must be >= 1 or None (forever), got {rule.remaining}")
        with self._lock:
            self._rules.append(rule)
        return rule

    def _take_rules(self, method: str, path: str) -> tuple[float, Rule | None]:
        """The total delay and the failure rule for one request, counting them as fired."""
        total_delay = 0.0
        failure: Rule | None = None
        with self._lock:
            for rule in self._rules:
                if not rule.matches(method, path) or (rule.fault != "delay" and failure is not None):
                    continue
                if rule.fault == "delay":
                    total_delay += rule.seconds
                else:
                    failure = rule
                rule.fired += 1
                if rule.remaining is not None:
                    rule.remaining -= 1
        return total_delay, failure

    # Counters: each record is in the log from the moment its request is read, and its byte count grows
    # before each write, so a client that has read a response always sees it counted.

    def requests(self) -> list[RequestRecord]:
        """A snapshot of every request received so far, in arrival order."""
        with self._lock:
            return [dataclasses.replace(record) for record in self._records]

    def count(self, method: str | None = None, path: PathMatcher = None) -> int:
        """How many requests matched `method` and `path` (None: any), faulted ones included."""
        return sum(1 for record in self.requests() if _matches(method, path, record.method, record.path))

    def bytes_sent(self, method: str | None = None, path: PathMatcher = None) -> int:
        """Response body bytes written to clients for requests matching `method` and `path`."""
        return sum(
            record.body_bytes for record in self.requests() if _matches(method, path, record.method, record.path)
        )

    def clear_counters(self) -> None:
        with self._lock:
            self._records.clear()

    def _log(self, record: RequestRecord) -> None:
        with self._lock:
            self._records.append(record)

    def _update(self, record: RequestRecord, **changes: object) -> None:
        with self._lock:
            for name, value in changes.items():
                setattr(record, name, value)

    def _add_bytes(self, record: RequestRecord, count: int) -> None:
        with self._lock:
            record.body_bytes += count


class _ProxyServer(socketserver.TCPServer):
    """A TCP server on 127.0.0.1 that runs each client connection in its own tracked thread, so `stop` can
    close every connection and join every thread (ThreadingMixIn would join without a timeout)."""

    allow_reuse_address = True

    def __init__(self, proxy: FaultProxy) -> None:
        super().__init__(("127.0.0.1", 0), _ProxyHandler)
        self.proxy = proxy
        self._connections_lock = threading.Lock()
        self._connections: dict[threading.Thread, socket.socket] = {}

    def process_request(self, request: socket.socket, client_address: tuple[str, int]) -> None:  # type: ignore[override]
        thread = threading.Thread(
            target=self._serve_connection, args=(request, client_address), name="fault-proxy-connection", daemon=True
        )
        with self._connections_lock:
            self._connections[thread] = request
        thread.start()

    def _serve_connection(self, request: socket.socket, client_address: tuple[str, int]) -> None:
        try:
            self.finish_request(request, client_address)
        except OSError:
            pass  # the client went away or the proxy is stopping: nothing to answer
        finally:
            self.shutdown_request(request)
            with self._connections_lock:
                self._connections.pop(threading.current_thread(), None)

    def close_connections_and_join(self, timeout: float) -> list[threading.Thread]:
        """Shut every open client socket (waking handlers blocked on reads) and join their threads; return
        those still alive."""
        with self._connections_lock:
            connections = list(self._connections.items())
        for _thread, request in connections:
            try:
                request.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for thread, _request in connections:
            thread.join(timeout)
        return [thread for thread, _request in connections if thread.is_alive()]


class _ProxyHandler(BaseHTTPRequestHandler):
    """One client connection: each request is read whole, judged against the rules, and answered."""

    protocol_version = "HTTP/1.1"
    timeout = IDLE_CONNECTION_TIMEOUT_SECONDS
    server: _ProxyServer

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
        pass  # tests read the request log, not stderr

    def do_GET(self) -> None:
        self._proxy_request()

    do_HEAD = do_PUT = do_POST = do_DELETE = do_OPTIONS = do_PATCH = do_GET

    def _proxy_request(self) -> None:
        proxy = self.server.proxy
        split = urllib.parse.urlsplit(self.path)
        record = RequestRecord(self.command, split.path, split.query, self.headers.get("Range"))
        proxy._log(record)
        body = self._read_request_body()
        seconds, failure = proxy._take_rules(self.command, split.path)
        if seconds:
            proxy._update(record, delayed=seconds)
            if proxy._stopping.wait(seconds):
                self._reset_connection(record)
                return
        if failure is None or failure.fault in ("truncate", "damage", "trickle", "ignore_range"):
            self._forward(record, body, failure)
        elif failure.fault == "reset":
            self._reset_connection(record, fault="reset")
        elif failure.fault == "slow_down":
            self._send_error_body(record, 503, "Slow Down", SLOW_DOWN_BODY, fault="slow_down")
        elif failure.fault == "server_error":
            self._send_error_body(record, 500, "Internal Server Error", INTERNAL_ERROR_BODY, fault="server_error")
        else:
            xml = (
                f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{failure.code}</Code><Message>{failure.message}</Message>'
                "<RequestId>fault-proxy</RequestId></Error>"
            ).encode()
            reason = http.client.responses.get(failure.status, "Error")
            self._send_error_body(record, failure.status, reason, xml, fault="error")

    def _read_request_body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            return self._read_chunked_body()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _read_chunked_body(self) -> bytes:
        parts = []
        while True:
            size_line = self.rfile.readline(65537)
            size = int(size_line.split(b";", 1)[0].strip(), 16)
            if size == 0:
                break
            parts.append(self.rfile.read(size))
            self.rfile.readline()  # the CRLF after each chunk
        while self.rfile.readline(65537) not in (b"\r\n", b"\n", b""):
            pass  # trailer fields: dropped, the body goes upstream with a Content-Length
        return b"".join(parts)

    def _forward(self, record: RequestRecord, body: bytes, failure: Rule | None) -> None:
        proxy = self.server.proxy
        headers = {name: value for name, value in self.headers.items() if name.lower() not in HOP_BY_HOP_HEADERS}
        if failure is not None and failure.fault == "ignore_range":
            headers = {name: value for name, value in headers.items() if name.lower() != "range"}
        if body or self.command in ("PUT", "POST", "PATCH"):
            headers["Content-Length"] = str(len(body))
        upstream = http.client.HTTPConnection(proxy.upstream_host, proxy.upstream_port, timeout=60)
        try:
            upstream.request(self.command, self.path, body=body, headers=headers)
            response = upstream.getresponse()
            self._relay_response(record, response, failure)
        except (ConnectionError, http.client.HTTPException, TimeoutError):
            # The upstream failed, or the client left, mid-exchange: the client (if still there) sees a reset.
            self._reset_connection(record, fault=record.fault or "aborted")
        finally:
            upstream.close()

    def _relay_response(self, record: RequestRecord, response: http.client.HTTPResponse, failure: Rule | None) -> None:
        proxy = self.server.proxy
        fault = failure.fault if failure is not None else None
        truncate_after = failure.after_bytes if fault == "truncate" else None
        damage_at = failure.after_bytes if fault == "damage" else None
        trickle = (failure.after_bytes, failure.seconds) if fault == "trickle" else None
        declared = response.getheader("Content-Length")
        # An upstream chunked body is read whole and sent with a Content-Length; a sized one is streamed.
        buffered = None if declared is not None or self.command == "HEAD" else response.read()
        length = int(declared) if buffered is None and declared is not None else len(buffered or b"")
        proxy._update(record, status=response.status, fault=fault)
        self.send_response(response.status, response.reason)
        for name, value in response.getheaders():
            if name.lower() not in HOP_BY_HOP_HEADERS and name.lower() != "content-length":
                self.send_header(name, value)
        if self.command != "HEAD" or declared is not None:
            self.send_header("Content-Length", str(length))
        self.end_headers()
        if self.command == "HEAD":
            return
        allowed = length if truncate_after is None else min(length, truncate_after)
        step = STREAM_CHUNK_BYTES if trickle is None else trickle[0]
        sent = 0
        while sent < allowed:
            chunk = (
                buffered[sent : min(allowed, sent + step)] if buffered is not None
                else response.read(min(step, allowed - sent))
            )
            if not chunk:
                raise http.client.IncompleteRead(b"", allowed - sent)
            if damage_at is not None and sent <= damage_at < sent + len(chunk):
                chunk = bytearray(chunk)
                chunk[damage_at - sent] ^= 1
                chunk = bytes(chunk)
            if trickle is not None:
                self.wfile.flush()
                if proxy._stopping.wait(trickle[1]):
                    self.close_connection = True
                    return
            proxy._add_bytes(record, len(chunk))
            self.wfile.write(chunk)
            sent += len(chunk)
        if truncate_after is not None and allowed < length:
            self.wfile.flush()
            self.close_connection = True  # the short body ends with the connection, as a dropped one would

    def _send_error_body(self, record: RequestRecord, status: int, reason: str, body: bytes, *, fault: str) -> None:
        proxy = self.server.proxy
        proxy._update(record, status=status, fault=fault)
        self.send_response(status, reason)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            proxy._add_bytes(record, len(body))
            self.wfile.write(body)

    def _reset_connection(self, record: RequestRecord, fault: str | None = None) -> None:
        """Abort the client connection: SO_LINGER 0 makes close() send an RST instead of a FIN."""
        if fault is not None:
            self.server.proxy._update(record, fault=fault)
        self.close_connection = True
        try:
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            return  # already gone
        # The socket's fd closes only when its makefile() readers are closed too.
        self.rfile.close()
        self.connection.close()


@pytest.fixture
def fault_proxy() -> Iterator[Callable[[str], FaultProxy]]:
    """A factory: `fault_proxy(upstream_url)` starts a FaultProxy; every one started is stopped (threads
    joined) at teardown. Use it from a test module with `from tests.helpers_fault_proxy import fault_proxy`."""
    started: list[FaultProxy] = []

    def start(upstream_url: str) -> FaultProxy:
        proxy = FaultProxy(upstream_url).start()
        started.append(proxy)
        return proxy

    yield start
    for proxy in reversed(started):
        proxy.stop()

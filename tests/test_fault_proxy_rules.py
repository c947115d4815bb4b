"""The fault proxy's rules for bodies and answers (tests/helpers_fault_proxy.py): `ignore_range`, `damage`,
`trickle` and `error`, each as a plain HTTP client sees it, against the stdlib upstream of test_fault_proxy."""

from __future__ import annotations

import pytest

from tests.helpers_fault_proxy import FaultProxy, fault_proxy  # noqa: F401 - fault_proxy is a fixture
from tests.test_fault_proxy import OBJECTS, _get, proxy, upstream  # noqa: F401 - proxy and upstream are fixtures

LARGE = OBJECTS["/bucket/large"]


@pytest.mark.timeout(30)
def test_ignore_range_forwards_without_the_range_header_so_the_whole_object_comes_back(proxy: FaultProxy) -> None:
    proxy.ignore_range(times=1, method="GET")
    assert _get(proxy, "/bucket/large", {"Range": "bytes=100-109"}) == (200, LARGE)
    assert _get(proxy, "/bucket/large", {"Range": "bytes=100-109"}) == (206, LARGE[100:110])
    assert [(record.fault, record.range, record.body_bytes) for record in proxy.requests()] == [
        ("ignore_range", "bytes=100-109", len(LARGE)), (None, "bytes=100-109", 10)
    ]


@pytest.mark.timeout(30)
def test_damage_flips_one_bit_of_the_body_and_keeps_its_length(proxy: FaultProxy) -> None:
    proxy.damage(70000, times=1, method="GET")  # past the first stream chunk
    status, body = _get(proxy, "/bucket/large")
    assert status == 200 and len(body) == len(LARGE)
    assert [position for position in range(len(LARGE)) if body[position] != LARGE[position]] == [70000]
    assert body[70000] == LARGE[70000] ^ 1
    assert _get(proxy, "/bucket/large") == (200, LARGE)
    assert [record.fault for record in proxy.requests()] == ["damage", None]


@pytest.mark.timeout(30)
def test_trickle_sends_the_whole_body_a_chunk_at_a_time(proxy: FaultProxy) -> None:
    proxy.trickle(0.001, chunk_bytes=5, times=1, method="GET")
    assert _get(proxy, "/bucket/small") == (200, OBJECTS["/bucket/small"])
    (record,) = proxy.requests()
    assert record.fault == "trickle" and record.body_bytes == len(OBJECTS["/bucket/small"])


@pytest.mark.timeout(30)
def test_error_answers_the_status_with_s3s_error_xml(proxy: FaultProxy) -> None:
    proxy.error(403, "InvalidAccessKeyId", "The AWS Access Key Id you provided does not exist in our records.", times=1)
    status, body = _get(proxy, "/bucket/small")
    assert status == 403
    assert b"<Code>InvalidAccessKeyId</Code>" in body and b"does not exist in our records" in body
    assert _get(proxy, "/bucket/small") == (200, OBJECTS["/bucket/small"])
    assert [(record.status, record.fault) for record in proxy.requests()] == [(403, "error"), (200, None)]


@pytest.mark.timeout(30)
def test_the_new_rules_refuse_bad_arguments(proxy: FaultProxy) -> None:
    with pytest.raises(ValueError):
        proxy.damage(-1)
    with pytest.raises(ValueError):
        proxy.trickle(-1.0)
    with pytest.raises(ValueError):
        proxy.trickle(0.1, chunk_bytes=0)

"""WebDataset tars: convert's samples are those `webdataset.WebDataset` reads from shards `webdataset`'s own writers
wrote (locally, by brace pattern and glob, gzipped, with workers, and by URL from S3); hostile tars are refused by
name; brace patterns expand as braceexpand (WebDataset's expander) expands them."""

from __future__ import annotations

import io
import json
import os
import tarfile
import tracemalloc
from pathlib import Path
from typing import Any

import braceexpand
import pytest
import webdataset as wds
from hypothesis import given
from hypothesis import strategies as st

import varstore
from varstore.conversion import convert
from varstore.conversion.input_files import URL_BLOCK_BYTES, expand_braces
from varstore.errors import VarstoreError
from varstore.remote.filesystems import open_filesystem

from .helpers_cli import assert_one_line_error, run
from .helpers_fault_proxy import fault_proxy  # noqa: F401 - a fixture

# What WebDataset adds to a sample besides its key and fields: where it was read from.
WEBDATASET_PLACES = ("__url__", "__local_path__")


def _samples(count: int) -> list[dict[str, Any]]:
    """Samples as a WebDataset user writes them: keys with folders, a two-dot extension, text, class and JSON."""
    return [
        {"__key__": f"split{index % 2}/{index:05d}", "jpg": bytes(range(index % 7)) * (index + 1),
         "seg.png": f"mask {index}".encode(), "txt": f"caption {index} é".encode(), "cls": str(index % 5).encode(),
         "json": json.dumps({"id": index, "tags": ["a", "b"][: index % 3]}).encode()}
        for index in range(count)
    ]


def _write_shards(folder: Path, samples: list[dict[str, Any]], per_shard: int, *, suffix: str = "tar") -> str:
    """`samples` written by webdataset's ShardWriter into shard-000.SUFFIX, ...; returns the brace pattern of them."""
    folder.mkdir(parents=True, exist_ok=True)
    with wds.ShardWriter(str(folder / f"shard-%03d.{suffix}"), maxcount=per_shard, verbose=0) as sink:
        for sample in samples:
            sink.write(sample)
    count = len(os.listdir(folder))
    return str(folder / f"shard-{{000..{count - 1:03d}}}.{suffix}")


def _read_back(path: Path) -> list[Any]:
    with varstore.open(path) as dataset:
        return list(dataset)


def _webdataset_read(pattern: str, *, decode: bool = False) -> list[dict[str, Any]]:
    """Every sample of `pattern` as webdataset reads it, in order, without the places it adds."""
    pipeline = wds.WebDataset(pattern, shardshuffle=False, empty_check=False)
    if decode:
        pipeline = pipeline.decode()
    return [{key: value for key, value in sample.items() if key not in WEBDATASET_PLACES} for sample in pipeline]


@pytest.mark.parametrize("workers", [1, 2])
def test_every_sample_equals_what_webdataset_reads_from_its_shardwriters_shards(tmp_path, workers):
    pattern = _write_shards(tmp_path / "shards", _samples(23), per_shard=5)
    written = convert(pattern, tmp_path / "ds", workers=workers)
    expected = _webdataset_read(pattern)
    assert written == len(expected) == 23
    assert _read_back(tmp_path / "ds") == expected
    assert all(isinstance(value, bytes) for sample in expected for key, value in sample.items() if key != "__key__")


def test_decoded_fields_equal_webdatasets_own_decoding(tmp_path):
    samples = [{key: value for key, value in sample.items() if key in ("__key__", "txt", "cls", "json")}
               for sample in _samples(9)]
    pattern = _write_shards(tmp_path / "shards", samples, per_shard=4)
    convert(pattern, tmp_path / "ds", decode=True)
    expected = _webdataset_read(pattern, decode=True)
    assert _read_back(tmp_path / "ds") == expected
    assert expected[3]["cls"] == 3 and expected[3]["txt"] == "caption 3 é" and expected[3]["json"]["id"] == 3


def test_gzipped_shards_and_a_glob_read_as_webdataset_reads_them(tmp_path):
    _write_shards(tmp_path / "shards", _samples(12), per_shard=5, suffix="tar.gz")
    convert(str(tmp_path / "shards" / "*.tar.gz"), tmp_path / "ds")
    assert _read_back(tmp_path / "ds") == _webdataset_read(str(tmp_path / "shards" / "shard-{000..002}.tar.gz"))


def test_command_line_converts_a_brace_pattern_with_decode(capsys, tmp_path):
    pattern = _write_shards(tmp_path / "shards", _samples(6), per_shard=4)
    code, out, err = run(capsys, "convert", pattern, tmp_path / "ds", "--decode", "--quiet")
    assert code == 0, err
    assert out.startswith("wrote 6 records")
    assert _read_back(tmp_path / "ds") == _webdataset_read(pattern, decode=True)


def test_shards_read_by_url_from_s3_equal_the_local_conversion(capsys, s3_server, tmp_path):
    pattern = _write_shards(tmp_path / "shards", _samples(11), per_shard=4)
    bucket = s3_server.new_bucket()
    fs, _ = open_filesystem(f"s3://{bucket}/x", s3_server.storage_options)
    for name in sorted(os.listdir(tmp_path / "shards")):
        fs.put_file(str(tmp_path / "shards" / name), f"{bucket}/train/{name}")
    url = f"s3://{bucket}/train/shard-{{000..002}}.tar"
    convert(url, tmp_path / "remote", source_storage_options=s3_server.storage_options, workers=2)
    assert _read_back(tmp_path / "remote") == _webdataset_read(pattern)
    assert s3_server.requests(bucket, method="GET")  # read from the server, not from a local copy
    code, out, err = run(capsys, "convert", url, tmp_path / "by-command", "--storage-options",
                         json.dumps(s3_server.storage_options), "--quiet")  # the options reach SRC, not the local DST
    assert code == 0, err
    assert _read_back(tmp_path / "by-command") == _webdataset_read(pattern)


def _large_shard_in_s3(s3_server, proxy_of, tmp_path) -> tuple[str, str, dict[str, Any], Any]:
    """(the local shard's pattern, its URL, storage options through a fault proxy, the proxy) of one WebDataset
    shard of a little over two URL blocks, uploaded to a fresh bucket of the S3 server."""
    block_samples = [{"__key__": f"{index:03d}", "bin": bytes([index]) * (URL_BLOCK_BYTES // 4 + index),
                      "txt": f"sample {index}".encode()} for index in range(9)]
    pattern = _write_shards(tmp_path / "shards", block_samples, per_shard=9)
    assert 2 * URL_BLOCK_BYTES < (tmp_path / "shards" / "shard-000.tar").stat().st_size < 3 * URL_BLOCK_BYTES
    bucket = s3_server.new_bucket()
    fs, _ = open_filesystem(f"s3://{bucket}/x", s3_server.storage_options)
    fs.put_file(str(tmp_path / "shards" / "shard-000.tar"), f"{bucket}/shard-000.tar")
    proxy = proxy_of(s3_server.endpoint_url)
    options = {**s3_server.storage_options, "endpoint_url": proxy.url}
    return pattern, f"s3://{bucket}/shard-000.tar", options, proxy


def test_a_connection_dropped_mid_tar_is_read_again_from_that_block_only(s3_server, fault_proxy, tmp_path):  # noqa: F811
    pattern, url, options, proxy = _large_shard_in_s3(s3_server, fault_proxy, tmp_path)
    key = "/" + url.removeprefix("s3://")
    gets_seen = []

    def second_get(path: str) -> bool:
        """True for the second GET of the shard: its second block, the first read in full."""
        gets_seen.append(path)
        return path == key and len([seen for seen in gets_seen if seen == key]) == 2

    proxy.truncate(1000, times=1, method="GET", path=second_get)
    convert(url, tmp_path / "out", source_storage_options=options)
    assert _read_back(tmp_path / "out") == _webdataset_read(pattern)
    ranges = [record.range for record in proxy.requests() if record.method == "GET" and record.path == key]
    second = f"bytes={URL_BLOCK_BYTES}-{2 * URL_BLOCK_BYTES - 1}"
    assert ranges[:2] == [f"bytes=0-{URL_BLOCK_BYTES - 1}", second]  # three blocks, the cut one read twice
    assert ranges[2] == second and len(ranges) == 4 and ranges[3].startswith(f"bytes={2 * URL_BLOCK_BYTES}-")
    assert [record.fault for record in proxy.requests() if record.path == key and record.fault] == ["truncate"]


def test_a_url_that_keeps_failing_is_refused_after_bounded_retries_naming_it(s3_server, fault_proxy, tmp_path):  # noqa: F811
    _, url, options, proxy = _large_shard_in_s3(s3_server, fault_proxy, tmp_path)
    key = "/" + url.removeprefix("s3://")
    proxy.slow_down(times=None, method="GET", path=key)  # 503 SlowDown (a reset the HTTP client itself retries)
    with pytest.raises(VarstoreError, match=r"failed 5 times") as raised:
        convert(url, tmp_path / "out", source_storage_options=options)
    assert url in str(raised.value)
    assert proxy.count("GET", key) == 5 and not (tmp_path / "out").exists()


def _tar(path: Path, members: list[tuple[tarfile.TarInfo, bytes | None]]) -> Path:
    with tarfile.open(path, "w") as archive:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            archive.addfile(info, None if data is None else io.BytesIO(data))
    return path


def _member(name: str, kind: bytes = tarfile.REGTYPE, linkname: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, linkname
    return info


def test_directories_and_metadata_members_are_left_out_as_webdataset_leaves_them(tmp_path):
    path = _tar(tmp_path / "a.tar", [
        (_member("train", tarfile.DIRTYPE), None), (_member("__meta__"), b"{}"), (_member("__info__/y.txt"), b"i"),
        (_member("train/__info__/x.txt"), b"kept"), (_member("train/1.jpg"), b"one"), (_member("train/1.TXT"), b"uno"),
        (_member("README"), b"no dot"), (_member("train/2.jpg"), b"two"),
    ])
    convert(str(path), tmp_path / "ds")
    expected = _webdataset_read(str(path))
    assert _read_back(tmp_path / "ds") == expected == [  # metadata is skipped at the top only, as WebDataset skips it
        {"__key__": "train/__info__/x", "txt": b"kept"}, {"__key__": "train/1", "jpg": b"one", "txt": b"uno"},
        {"__key__": "train/2", "jpg": b"two"}]


@pytest.mark.parametrize(("kind", "said"), [(tarfile.SYMTYPE, "a symbolic link to '/etc/passwd'"),
                                             (tarfile.LNKTYPE, "a hard link to '/etc/passwd'"),
                                             (tarfile.FIFOTYPE, "a FIFO")])
def test_a_member_that_is_not_a_regular_file_is_refused_by_name(capsys, tmp_path, kind, said):
    path = _tar(tmp_path / "a.tar", [(_member("1.jpg"), b"x"), (_member("1.txt", kind, "/etc/passwd"), None)])
    code, _, err = run(capsys, "convert", path, tmp_path / "ds")
    assert_one_line_error(code, err, "a.tar", f"the member '1.txt' is {said}, not a regular file")
    assert not (tmp_path / "ds").exists()


def test_a_member_claiming_more_bytes_than_the_archive_has_is_refused_before_it_is_read(capsys, tmp_path):
    path = _tar(tmp_path / "a.tar", [(_member("1.jpg"), b"x" * 5000)])
    with open(path, "r+b") as file:
        file.truncate(512 + 1000)  # the header, and 1,000 of the member's 5,000 bytes
    code, _, err = run(capsys, "convert", path, tmp_path / "ds")
    assert_one_line_error(code, err, "a.tar", "the member '1.jpg' claims 5,000 bytes from byte 512, past the end of "
                          "the 1,512-byte archive")


def test_a_gzipped_tar_cut_short_is_refused_naming_the_last_member_reached(capsys, tmp_path):
    with tarfile.open(tmp_path / "a.tar.gz", "w:gz") as archive:
        for index in range(3):
            data = os.urandom(20_000)  # incompressible: the cut falls inside the members
            info = tarfile.TarInfo(f"{index}.bin")
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    size = os.path.getsize(tmp_path / "a.tar.gz")
    with open(tmp_path / "a.tar.gz", "r+b") as file:
        file.truncate(size * 2 // 3)
    code, _, err = run(capsys, "convert", tmp_path / "a.tar.gz", tmp_path / "ds")
    assert_one_line_error(code, err, "a.tar.gz", "the tar is damaged or cut short")
    assert "'1.bin'" in err


def test_a_gzipped_tar_whose_crc_does_not_match_is_refused_where_webdataset_reads_it(capsys, tmp_path):
    pattern = _write_shards(tmp_path / "shards", _samples(3), per_shard=3, suffix="tar.gz")
    damaged = bytearray((tmp_path / "shards" / "shard-000.tar.gz").read_bytes())
    damaged[-8] ^= 0xFF  # the gzip trailer's CRC32 of the tar: every member still decompresses
    (tmp_path / "shards" / "shard-000.tar.gz").write_bytes(damaged)
    assert len(_webdataset_read(pattern)) == 3
    code, _, err = run(capsys, "convert", pattern, tmp_path / "ds")
    assert_one_line_error(code, err, "shard-000.tar.gz: the compressed tar is damaged or cut short after the member "
                          "'split0/00002.txt'", "CRC")


def test_a_sample_repeating_an_extension_is_refused_as_webdataset_refuses_it(capsys, tmp_path):
    path = _tar(tmp_path / "a.tar", [(_member("1.jpg"), b"a"), (_member("1.JPG"), b"b")])
    with pytest.raises(ValueError, match="duplicate file name"):
        _webdataset_read(str(path))
    code, _, err = run(capsys, "convert", path, tmp_path / "ds")
    assert_one_line_error(code, err, "a.tar, sample '1'", "the member '1.JPG' repeats the extension 'jpg'")


def test_a_sample_over_max_record_bytes_is_refused_before_its_last_member_is_read(capsys, tmp_path):
    path = _tar(tmp_path / "a.tar", [(_member("1.jpg"), b"a" * 600), (_member("1.png"), b"b" * 600)])
    code, _, err = run(capsys, "convert", path, tmp_path / "ds", "--max-record-bytes", "1199")
    assert_one_line_error(code, err, "a.tar, sample '1'", "its members reach 1,200 bytes at '1.png'")
    convert(str(path), tmp_path / "ok", max_record_bytes=1200)
    assert _read_back(tmp_path / "ok") == [{"__key__": "1", "jpg": b"a" * 600, "png": b"b" * 600}]


def test_a_field_that_does_not_decode_names_its_member(tmp_path):
    path = _tar(tmp_path / "a.tar", [(_member("7.cls"), b"seven")])
    refusal = r"a\.tar, sample '7', member '7\.cls': cannot decode it as WebDataset decodes \.cls"
    with pytest.raises(VarstoreError, match=refusal):
        convert(str(path), tmp_path / "ds", decode=True)


def test_a_file_that_is_not_a_tar_is_refused(capsys, tmp_path):
    (tmp_path / "a.tar").write_bytes(b"not a tar at all" * 100)
    code, _, err = run(capsys, "convert", tmp_path / "a.tar", tmp_path / "ds")
    assert_one_line_error(code, err, "a.tar", "not a tar archive")


def _peak_bytes_of_reading(path: Path) -> int:
    """The peak of Python's allocations while every sample of the tar at `path` is read (not written)."""
    from varstore.conversion.input_files import InputFile
    from varstore.conversion.webdataset import WebDatasetSource
    from varstore.progress import Counter

    source = WebDatasetSource(str(path), decode=False, max_record_bytes=1 << 20, storage_options=None)
    tracemalloc.start()
    try:
        for _ in source.samples(InputFile(str(path), os.path.getsize(path)), Counter()):
            pass
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_reading_a_tar_holds_no_more_for_ten_times_the_members(tmp_path):
    """tarfile's stream keeps every member's header unless told not to: 10,000 of them would hold megabytes."""
    for count in (1_000, 10_000):
        _tar(tmp_path / f"{count}.tar", [(_member(f"{index:06d}.cls"), b"1") for index in range(count)])
    few, many = (_peak_bytes_of_reading(tmp_path / f"{count}.tar") for count in (1_000, 10_000))
    assert many < few + (1 << 20), f"10,000 members peaked at {many:,} bytes, 1,000 at {few:,}"


_NAME = st.text(alphabet="abc_-", min_size=0, max_size=3)


@st.composite
def _brace_patterns(draw: Any, depth: int = 0) -> str:
    """Patterns of literal text, comma lists (nested) and integer ranges, zero-padded or not, up or down."""
    pieces = []
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["text", "range", "list"] if depth < 2 else ["text", "range"]))
        if kind == "text":
            pieces.append(draw(_NAME))
        elif kind == "range":
            first, last = draw(st.integers(0, 12)), draw(st.integers(0, 12))
            width = draw(st.integers(1, 3))
            pieces.append(f"{{{str(first).zfill(width)}..{str(last).zfill(draw(st.integers(1, 3)))}}}")
        else:
            choices = draw(st.lists(_brace_patterns(depth + 1) | _NAME, min_size=2, max_size=3))
            pieces.append("{" + ",".join(choices) + "}")
    return "".join(pieces)


@given(_brace_patterns())
def test_brace_patterns_expand_as_braceexpand_expands_them(pattern):
    assert expand_braces(pattern) == list(braceexpand.braceexpand(pattern))


@pytest.mark.parametrize("pattern", ["{0..10}", "{00..3}", "{7..010}", "{0..0}", "a{1,{2..4}}b{x}"])
def test_ranges_are_padded_as_braceexpand_pads_them(pattern):
    assert expand_braces(pattern) == list(braceexpand.braceexpand(pattern))


@pytest.mark.parametrize("pattern", ["shard-{a,b", "shard-a}.tar", "x{0..3}}"])
def test_unbalanced_braces_are_refused_as_braceexpand_refuses_them(pattern, tmp_path):
    with pytest.raises(braceexpand.UnbalancedBracesError):
        list(braceexpand.braceexpand(pattern))
    with pytest.raises(VarstoreError, match="brace"):
        convert(pattern, tmp_path / "ds", format="webdataset")


def test_a_pattern_naming_too_many_files_is_refused_before_they_are_listed(tmp_path):
    with pytest.raises(VarstoreError, match="names 1,000,000,000 files"):
        convert(str(tmp_path / "{0..999}{0..999}{0..999}.tar"), tmp_path / "ds")

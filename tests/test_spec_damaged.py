"""The damaged cases of spec/vectors/damaged/: every reader must refuse each, at the point its description names.

A case is a shard (``shard.index`` + ``shard.data``) or a dataset directory, with ``NAME.json``:
the rule it breaks, what changed, and ``refused_at``: "open" (opening raises), "read" (opening works,
reading record ``record`` raises) or "verify" (only a full verification raises). The spec-only reader
must refuse each for that rule at that point; varstore must refuse each at that point.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import varstore

from . import spec_reader

VECTORS = Path(__file__).resolve().parent.parent / "spec" / "vectors"
DAMAGED = VECTORS / "damaged"
CASES = sorted(path.stem for path in DAMAGED.glob("*.json"))
GOOD_SHARDS = sorted(path.stem for path in VECTORS.glob("*.json"))
GOOD_DATASETS = sorted(path.stem for path in (VECTORS / "datasets").glob("*.json"))


def _case(name: str) -> dict:
    return json.loads((DAMAGED / f"{name}.json").read_text(encoding="utf-8"))


def _path(name: str, kind: str) -> str:
    return str(DAMAGED / name / "shard") if kind == "shard" else str(DAMAGED / name)


def test_damaged_cases_cover_every_stage_and_both_kinds():
    described = [_case(name) for name in CASES]
    assert {(case["kind"], case["refused_at"]) for case in described} >= {
        ("shard", "open"), ("shard", "read"), ("shard", "verify"), ("dataset", "open"), ("dataset", "read")
    }
    assert sorted(path.name for path in DAMAGED.iterdir() if path.is_dir()) == CASES


@pytest.mark.parametrize("name", CASES)
def test_spec_reader_refuses_case_for_its_rule_at_its_point(name):
    case = _case(name)
    opener = spec_reader.open_shard if case["kind"] == "shard" else spec_reader.open_dataset
    with pytest.raises(spec_reader.SpecError) as refused:
        opened = opener(_path(name, case["kind"]))
        assert case["refused_at"] != "open", "opened what must be refused at open"
        for i in range(case.get("record", 0)):
            opened.record(i)
        if case["refused_at"] == "read":
            opened.record(case["record"])
            pytest.fail(f"read record {case['record']}, which must be refused")
        for i in range(len(opened.offsets) - 1 if case["kind"] == "shard" else sum(e["records"] for e in opened.manifest["shards"])):
            opened.record(i)
        opened.verify()
    assert refused.value.rule == case["rule"], str(refused.value)


@pytest.mark.parametrize("name", CASES)
def test_varstore_refuses_case_at_its_point(name):
    case = _case(name)
    path = _path(name, case["kind"])
    if case["refused_at"] == "open":
        with pytest.raises(varstore.VarstoreError):
            varstore.open(path).close()
        return
    with varstore.open(path) as reader:
        if case["refused_at"] == "read":
            with pytest.raises(varstore.VarstoreError):
                reader[case["record"]]
        else:
            list(reader)
        with pytest.raises(varstore.VarstoreError):
            reader.verify()


@pytest.mark.parametrize("name", GOOD_SHARDS)
def test_spec_reader_reads_every_good_shard_vector(name):
    assert spec_reader.read_shard(str(VECTORS / name))["record_count"] == json.loads((VECTORS / f"{name}.json").read_text())["record_count"]


@pytest.mark.parametrize("name", GOOD_DATASETS)
def test_spec_reader_reads_every_good_dataset_vector(name):
    spec_reader.read_dataset(str(VECTORS / "datasets" / name))

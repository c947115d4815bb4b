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


def _spec_refusal(opener, path: str) -> tuple[str, int | None, str | None]:
    """Where the spec-only reader refuses `path`: ("open" | "read" | "verify" | "accepted", record, rule)."""
    try:
        opened = opener(path)
    except spec_reader.SpecError as error:
        return "open", None, error.rule
    for i in range(len(opened)):
        try:
            opened.record(i)
        except spec_reader.SpecError as error:
            return "read", i, error.rule
    try:
        opened.verify()
    except spec_reader.SpecError as error:
        return "verify", None, error.rule
    return "accepted", None, None


def _varstore_refusal(path: str) -> tuple[str, int | None]:
    """Where varstore refuses `path`: ("open" | "read" | "verify" | "accepted", record)."""
    try:
        reader = varstore.open(path)
    except varstore.VarstoreError:
        return "open", None
    with reader:
        for i in range(len(reader)):
            try:
                reader[i]
            except varstore.VarstoreError:
                return "read", i
        try:
            reader.verify()
        except varstore.VarstoreError:
            return "verify", None
    return "accepted", None


@pytest.mark.parametrize("name", CASES)
def test_spec_reader_refuses_case_for_its_rule_at_its_point(name):
    case = _case(name)
    opener = spec_reader.open_shard if case["kind"] == "shard" else spec_reader.open_dataset
    assert _spec_refusal(opener, _path(name, case["kind"])) == (case["refused_at"], case.get("record"), case["rule"])


@pytest.mark.parametrize("name", CASES)
def test_varstore_refuses_case_at_its_point(name):
    case = _case(name)
    assert _varstore_refusal(_path(name, case["kind"])) == (case["refused_at"], case.get("record"))


@pytest.mark.parametrize("name", GOOD_SHARDS)
def test_every_good_shard_vector_is_accepted_by_both_readers(name):
    path = str(VECTORS / name)
    assert _spec_refusal(spec_reader.open_shard, path) == ("accepted", None, None)
    assert _varstore_refusal(path) == ("accepted", None)


@pytest.mark.parametrize("name", GOOD_DATASETS)
def test_every_good_dataset_vector_is_accepted_by_both_readers(name):
    path = str(VECTORS / "datasets" / name)
    assert _spec_refusal(spec_reader.open_dataset, path) == ("accepted", None, None)
    assert _varstore_refusal(path) == ("accepted", None)

"""The damaged cases of spec/vectors/damaged/: every reader must refuse each, at the point its description names.

A case is a shard (``shard.index`` + ``shard.data``; data-file-missing lacks the second) or a dataset directory,
with ``NAME.json``: the rule it breaks (a label of the spec's §6.3 table), what changed, and ``refused_at``: "open"
(opening raises), "read" (opening works, reading record ``record`` raises) or "verify" (only a full verification raises). The spec-only reader
must refuse each for that rule at that point; varstore must refuse each at that point.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

import varstore

from . import spec_reader

VECTORS = Path(__file__).resolve().parent.parent / "spec" / "vectors"
DAMAGED = VECTORS / "damaged"
CASES = sorted(path.stem for path in DAMAGED.glob("*.json"))
GOOD_SHARDS = sorted(path.stem for path in VECTORS.glob("*.json"))
GOOD_DATASETS = sorted(path.stem for path in (VECTORS / "datasets").glob("*.json"))
SPEC = VECTORS.parent / "FORMAT.md"


def _spec_labels() -> set[str]:
    """The labels of §6.3's table (each failure -> its label): the last cell of each row after its heading line."""
    text = SPEC.read_text(encoding="utf-8")
    table = text[text.index("Each failure has one label") :].split("\n\n")[1]
    return {re.fullmatch(r".*\| `([^`]+)` \|", row).group(1) for row in table.splitlines()[2:]}


def test_every_damaged_case_names_a_label_of_the_spec_table():
    labels = _spec_labels()
    described = {path.name: json.loads(path.read_text(encoding="utf-8"))["rule"] for path in VECTORS.glob("**/damaged/*.json")}
    assert len(described) > len(CASES)  # the compressed cases too
    assert {name: rule for name, rule in described.items() if rule not in labels} == {}


def test_every_label_the_spec_reader_raises_is_in_the_spec_table():
    """Every string literal of spec_reader.py shaped like a label ("§1.3 step 8", "§2.1") is one it can give."""
    tree = ast.parse(Path(spec_reader.__file__).read_text(encoding="utf-8"))
    shaped = re.compile(r"§[0-9.]+( step [0-9]+| read| verify)?")
    raised = {node.value for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str) and shaped.fullmatch(node.value)}
    assert len(raised) > 10 and raised <= _spec_labels()


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

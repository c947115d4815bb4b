"""`write_dataframe` with Spark's Python workers on a Python that cannot import varstore (a venv's Python run
without activating it leaves them on the system ``python3``): refused with one error naming that Python and what to
set, before any part of the dataset is written. One extra one-task Spark job, on the session of tests/test_spark.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark", reason="the Spark tests need the spark extra: pip install -e '.[spark]'")

from varstore.errors import VarstoreError
from varstore.spark import write_dataframe

from .test_spark import spark  # noqa: F401 - the session's SparkSession, started (or skipped) there

# As in tests/test_spark.py: the first Spark job of a session starts its Python daemon and workers, minutes on a busy
# machine, so the test is stopped only after 15 minutes; creating the venv is given a generous safety net too.
pytestmark = pytest.mark.timeout(900)
VENV_SAFETY_NET_S = 300


@pytest.fixture(scope="module")
def python_without_varstore(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Python of a new venv with nothing installed: the same version as this one, but no varstore, no pandas."""
    venv = tmp_path_factory.mktemp("bare-venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=VENV_SAFETY_NET_S)
    return venv / "bin" / "python"


def test_workers_whose_python_cannot_import_varstore_are_refused_naming_it_and_what_to_set(
    spark: Any, python_without_varstore: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch  # noqa: F811
) -> None:
    frame = spark.createDataFrame([(b"record",)], "payload binary")
    monkeypatch.setattr(spark.sparkContext, "pythonExec", str(python_without_varstore))  # what PYSPARK_PYTHON sets
    with pytest.raises(VarstoreError) as refused:
        write_dataframe(frame, tmp_path / "dataset", column="payload")
    message = str(refused.value)
    assert len(message.splitlines()) == 1
    assert f"Spark's Python workers run {python_without_varstore}, which cannot import varstore" in message
    assert "No module named" in message and "PYSPARK_PYTHON" in message and "spark.pyspark.python" in message
    assert not (tmp_path / "dataset").exists()

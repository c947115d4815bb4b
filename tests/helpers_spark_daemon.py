"""The Spark tests' Python daemon (``spark.python.daemon.module``): pyspark's own daemon with pandas, pyarrow and
varstore.spark imported before it forks workers, so every worker (each retried attempt gets a fresh one) starts
with them loaded instead of importing them again on a busy machine."""

import pandas  # noqa: F401
import pyarrow  # noqa: F401
from pyspark.daemon import manager

import varstore.spark  # noqa: F401

if __name__ == "__main__":
    manager()

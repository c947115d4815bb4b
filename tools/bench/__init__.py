"""Benchmarks of varstore beside the record stores people use today (issue 5).

Run ``python3 tools/bench/run.py [--scale S] [--out DIR]``: it sets up ``.venv-bench``
with the peers, measures every peer in its own subprocesses on the same seeded
workloads, and writes a markdown table, a PNG chart and the raw figures as JSON.
"""

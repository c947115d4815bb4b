"""Many shards: `ShardedReader` over a source (`local_source`, `remote_source`), `open` (`opening`, the one place
that chooses), `ShardedWriter` (`writer`, with the `local_target` or `remote_target` it commits to, and
`run_start`: a new run or a resume), and the part writers of a conversion with their one commit (`parts`).
"""

"""Operations on whole datasets, each one typed function that does the work and returns a result to render:
`copy` (a dataset or shard between local paths and URLs, verified on arrival), `merge` (many shards and datasets
into one), `repair` (drop the shards that fail verification), `describe` (what a store holds, from headers and the
manifest alone), `verify` (every structure and checksum, shard by shard) and `statistics` (record sizes).

What they share: `locations` (a local path or a URL, and the options that reach a URL) and `transfer` (writing a
dataset's shards and manifest, locally or at a URL); they report progress as `varstore.progress` says. The command
line (`varstore.cli`) is a face over these.
"""

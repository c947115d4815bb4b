"""Object storage (s3://, memory://, any fsspec URL): the storage layer under the remote readers and writers.

Nothing here imports fsspec or a backend until a URL is opened, so `import varstore` stays free of them.
"""

"""One shard: `Writer`, `Reader` (through memory maps), `RemoteShard` (through ranged requests), the index they
both check records against (`index`) and what the readers share (`reader_base`).
"""

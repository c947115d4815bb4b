"""Datasets from other formats: `driver` (`convert`: ``varstore convert`` in one process or several), the input formats
it reads (`sources`), how a field is found in a sample (`fields`) and the progress it reports (`varstore.progress`);
`megatron` (`import_megatron`, `export_megatron`: Megatron-LM's token files in place, both ways); the peers' formats
`convert` reads, each a module (`huggingface`, `mds`, `litdata`, `webdataset`, `tfrecord`) over `source_base` (what a
source is) and `input_files` (the many files a pattern, glob or URL names).
"""

from .driver import convert
from .megatron import export_megatron, import_megatron

__all__ = ["convert", "export_megatron", "import_megatron"]

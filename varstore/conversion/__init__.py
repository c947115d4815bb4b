"""Datasets from other formats: `driver` (`convert`: ``varstore convert`` in one process or several), the input formats
it reads (`sources`), how a field is found in a sample (`fields`) and the progress it reports (`varstore.progress`);
`megatron` (`import_megatron`, `export_megatron`: Megatron-LM's token files in place, both ways).
"""

from .driver import convert
from .megatron import export_megatron, import_megatron

__all__ = ["convert", "export_megatron", "import_megatron"]

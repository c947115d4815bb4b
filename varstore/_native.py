"""varstore's optional C extension (varstore/_speedups.c), or None.

None where it was not built (no compiler at install) or where the environment sets
``VARSTORE_NO_EXTENSION=1``; every caller then takes its pure-Python path, which gives
the same records, checksums and errors, only slower.
"""

from __future__ import annotations

import os
from types import ModuleType


def _load() -> ModuleType | None:
    if os.environ.get("VARSTORE_NO_EXTENSION", "") not in ("", "0"):
        return None
    try:
        from . import _speedups
    except ImportError:
        return None
    return _speedups


speedups = _load()

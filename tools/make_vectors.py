"""Write the golden shards in spec/vectors/ from their descriptions: ``python tools/make_vectors.py``.

Each description ``spec/vectors/NAME.json`` (spec/FORMAT.md §6) is the source of truth: written by hand,
independently of varstore, and never written by this tool. This tool reads each one, writes NAME.index and
NAME.data with varstore's Writer, and refuses to finish if the shard's header disagrees with the facts the
description states (format version, record count, data size and CRC32C). Run it only when the format or a
description changes, in the same commit; tests/test_spec_vectors.py checks that tests/spec_writer.py, which
knows only the spec, writes the same bytes.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import varstore  # noqa: E402
from varstore.conversion.megatron import SHARD_NAME, export_megatron, import_megatron  # noqa: E402
from varstore.format.notation import from_json  # noqa: E402

VECTORS = ROOT / "spec" / "vectors"


def write_vector(prefix: Path, description: dict[str, Any]) -> None:
    """Write the shard `description` describes at `prefix` with varstore's Writer (or, for a shard whose data
    CRC32C is not recorded, its Megatron import), replacing any old one."""
    if not description.get("data_crc32c_recorded", True):
        _write_imported_vector(prefix, description)
        return
    _write_records(prefix, description)


def _write_imported_vector(prefix: Path, description: dict[str, Any]) -> None:
    """The records written, exported as a Megatron .bin + .idx and imported back without reading the .bin (§1.2's
    1.3), the imported shard's files copied to `prefix`."""
    with tempfile.TemporaryDirectory() as scratch:
        _write_records(Path(scratch) / "records", description)
        export_megatron(Path(scratch) / "records", Path(scratch) / "corpus")
        import_megatron(Path(scratch) / "corpus", Path(scratch) / "dataset")
        for suffix in (".index", ".data"):
            shutil.copyfile(Path(scratch) / "dataset" / (SHARD_NAME + suffix), str(prefix) + suffix)


def _write_records(prefix: Path, description: dict[str, Any]) -> None:
    params = description["codec_params"]
    with varstore.Writer(
        prefix,
        overwrite=True,
        codec=description["codec"],
        dtype=params.get("dtype"),
        shape=params.get("shape"),
        metadata=description["metadata"],
        checksums=description["record_checksums"],
    ) as writer:
        writer.extend(from_json(record) for record in description["records"])


def header_disagreements(prefix: Path, description: dict[str, Any]) -> list[str]:
    """The header facts of the shard at `prefix` that differ from those its description states."""
    with varstore.open(prefix) as reader:
        header = reader.header
        written = {
            "format_version": [varstore.format.header.MAJOR_VERSION, header.minor_version],
            "record_count": header.record_count,
            "data_size": header.data_size,
            "data_crc32c": header.data_crc32c,
        }
    return [f"{field}: described {description[field]}, written {value}" for field, value in written.items() if description[field] != value]


def main() -> None:
    failed = False
    for path in sorted(VECTORS.glob("*.json")):
        description = json.loads(path.read_text(encoding="utf-8"))
        prefix = path.with_suffix("")
        write_vector(prefix, description)
        disagreements = header_disagreements(prefix, description)
        for disagreement in disagreements:
            print(f"{path.name}: {disagreement}", file=sys.stderr)
        failed = failed or bool(disagreements)
        index_size = prefix.with_suffix(".index").stat().st_size
        print(f"{prefix.name}: {description['record_count']} records, {index_size} index bytes, {description['data_size']} data bytes")
    if failed:
        sys.exit("the written shards disagree with their descriptions (above): varstore or a description is wrong")


if __name__ == "__main__":
    main()

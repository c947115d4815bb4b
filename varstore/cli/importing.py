"""``varstore import`` and ``varstore export``: another library's files as a varstore dataset in place, and back
(Megatron-LM's ``.bin`` + ``.idx``)."""

from __future__ import annotations

import argparse
from typing import Any

from ..conversion.megatron import DOCUMENTS_SHARD_NAME, MegatronSummary, export_megatron, import_megatron
from ..local.file_url import resolve_file_url
from .arguments import command_parser, store_path
from .output import plural

_IMPORT_EPILOG = f"""cost:
  The dataset's data file is a hard link of PREFIX.bin: no token is copied
  (across filesystems it is copied, and the command says so). The new index
  takes 8 bytes a sequence (12 with --checksums). Only the .idx and the first
  and last 4 KiB of the .bin are read: the shard says its whole-file data
  checksum is not recorded, and `varstore verify` checks everything else and
  says so. --data-crc (or --checksums) reads the whole .bin once to record it.

documents:
  Megatron's document indices are in the metadata "megatron": "one per sequence"
  when every document is one sequence, else the name of a side shard,
  {DOCUMENTS_SHARD_NAME}, holding them as one int64 array.

examples:
  varstore import megatron corpus_text_document corpus/
  varstore export megatron corpus/ exported_text_document
"""


def add_parser(commands: Any) -> None:
    importing = commands.add_parser("import", help="make a dataset of another library's files in place",
                                    description="Make a dataset of another library's files, without copying their data.")
    formats = importing.add_subparsers(dest="format", metavar="FORMAT", required=True)
    megatron = command_parser(formats, "megatron", _run_import, help="Megatron-LM's PREFIX.bin and PREFIX.idx",
                              description="Make the one-shard dataset DST of the Megatron dataset PREFIX.bin + "
                              "PREFIX.idx, one ndarray record per sequence.", epilog=_IMPORT_EPILOG)
    megatron.add_argument("prefix", metavar="PREFIX", type=resolve_file_url, help="the path of PREFIX.bin and PREFIX.idx, without the suffix")
    megatron.add_argument("destination", metavar="DST", type=resolve_file_url, help="the dataset directory to write: new or empty")
    megatron.add_argument("--checksums", action="store_true",
                          help="also store each record's CRC32C (one pass over the .bin, which records the data CRC32C too)")
    megatron.add_argument("--data-crc", action="store_true",
                          help="read the whole .bin once to record its CRC32C in the header (default: not recorded)")

    exporting = commands.add_parser("export", help="write a dataset in another library's format in place",
                                    description="Write a shard or dataset in another library's format, without copying its data.")
    formats = exporting.add_subparsers(dest="format", metavar="FORMAT", required=True)
    megatron = command_parser(formats, "megatron", _run_export, help="Megatron-LM's PREFIX.bin and PREFIX.idx",
                              description="Write PREFIX.idx and PREFIX.bin (a hard link of the data file) of a shard, "
                              "or a dataset of one shard, of 1-D ndarray records of uint8, int8, int16, int32, int64, "
                              "float64, float32 or uint16, so that megatron-core's IndexedDataset reads it.")
    megatron.add_argument("path", type=store_path, help="the shard or one-shard dataset")
    megatron.add_argument("prefix", metavar="PREFIX", type=resolve_file_url, help="where to write PREFIX.bin and PREFIX.idx")


def _describe(made: MegatronSummary, where: str) -> None:
    print(f"{where}: {plural(made.sequences, 'sequence')} in {plural(made.documents, 'document')}; the data is "
          + ("a hard link, no token copied" if made.linked else "a copy: no hard link could be made (another filesystem)"))


def _run_import(args: argparse.Namespace) -> int:
    _describe(import_megatron(args.prefix, args.destination, checksums=args.checksums, data_crc=args.data_crc),
              args.destination)
    return 0


def _run_export(args: argparse.Namespace) -> int:
    _describe(export_megatron(args.path, args.prefix), args.prefix)
    return 0

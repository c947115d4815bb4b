"""``varstore convert``: build a dataset from .npy arrays, raw token files, JSON Lines, text, folders of files or Parquet."""

from __future__ import annotations

import argparse
import os
import time
from contextlib import nullcontext
from typing import Any, ContextManager

import varstore

from ..remote.filesystems import is_url
from .. import conversion  # a module: varstore.conversion imports this package
from ..storage import make_directories
from .arguments import add_quiet_option, byte_size, json_object, positive_int
from .destination import add_allow_other_files_option, check_destination, removed_if_created_and_failed
from .errors import CommandError, UsageError
from .output import format_size, plural, progress_bar
from .sources import FORMAT_OPTIONS, SOURCE_OPTIONS, FolderSource, Source, open_source, source_format
from .stores import REMOTE_EPILOG, add_location_options, check_location_options, open_store

_EPILOG = """sources (the format is told by the name, or by --format):
  DIR/             folder: one msgpack record {"name": relative path, "data": bytes} per file, sorted by path;
                   with --labels (torchvision's ImageFolder layout DIR/CLASS/FILE): {"image": bytes,
                   "label": int, "path": relative path}, label k being the k-th sorted sub-folder name,
                   and the names listed in the metadata as {"labels": [...]}. Hidden files and folders
                   (names starting with '.': .DS_Store, .ipynb_checkpoints/) are left out at every level,
                   with or without --labels (stricter than ImageFolder, which would make
                   .ipynb_checkpoints a class). With --labels a class folder with no file is refused (as
                   ImageFolder refuses it) and a link to a class folder is followed (as ImageFolder
                   does); other links to folders are refused. DST must lie outside DIR and
                   outside every class folder (a linked one included).
  FILE.npy         npy: one ndarray record per row, or split along the first axis by --offsets
  FILE.bin         tokens: raw token ids of --dtype, one record per document; each --separator token
                   stays the last token of the document it ends (nanoGPT's end-of-text token reaches
                   the model), unless --drop-separator: 1 2 9 3 9 4 with separator 9 gives [1 2 9] [3 9] [4]
  FILE.jsonl       jsonl: one msgpack record per line, or the text of one --field (str, or bytes with --codec);
                   a null field is an error unless --skip-null leaves that line out
  FILE.txt         text: one record per line, line endings removed (str, or bytes with --codec bytes)
  FILE.parquet     parquet: one msgpack record per row, or one --field column (needs pyarrow);
                   null values as for jsonl

limits:
  Memory stays bounded: arrays and token files are memory-mapped and written in
  16 MiB pieces; Parquet is read in batches of rows (pyarrow's memory follows
  the file's row-group size). A record is held whole in
  memory while it is written, so a line (jsonl, text) or a folder's file longer
  than --max-record-bytes (default 64M) is refused with its name and line.
  An .npy array or Parquet file whose header claims more records than the file
  has bytes (e.g. an .npy of shape (2**40, 0): rows of no bytes) is refused
  before anything is written.
  DST is locked for one writer: a second convert or merge into it is refused
  (with --workers, DST is checked when the dataset is committed, at the end).
  DST must be new, empty or a dataset (replaced only with --overwrite): a folder
  holding other files is refused unless --allow-other-files.
  A failed convert removes what it wrote, and DST itself if it created it.
  DST may be a URL of object storage (s3://bucket/dataset): shards are written in
  a staging directory on this machine and each is uploaded once committed; the
  manifest is uploaded last, so a reader never finds a partial dataset.

workers:
  --workers N cuts SRC into N contiguous parts (a folder's files, byte ranges of
  JSON Lines, text and token files cut at line or document boundaries, rows of
  an .npy array, row groups of a Parquet file), converts each in a worker process
  and commits the parts in order: the records, and their order, are those of
  --workers 1; each part begins its own shards. A failing worker fails convert
  with its error and removes every shard written; a killed convert leaves no
  manifest (the part-* shards its workers wrote stay in DST, listed by none,
  until a convert --overwrite with --workers 2 or more into a local DST
  removes them).

examples:
  varstore convert train.bin train/ --dtype uint16 --separator 50256
  varstore convert docs.jsonl docs/ --field text --max-shard-bytes 512M
  varstore convert photos/ images/ --labels
  varstore convert docs.jsonl s3://bucket/docs --field text
  varstore convert docs.jsonl docs/ --field text --workers 8

""" + REMOTE_EPILOG


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "convert",
        help="build a dataset from .npy, token, JSON Lines, text, folder or Parquet sources",
        description="Build a dataset directory DST from SRC, streaming: memory stays bounded whatever the size "
        "(see limits below).",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("source", metavar="SRC", help="the file or folder to read")
    parser.add_argument("destination", metavar="DST", help="the dataset directory to write, or a URL of object storage")
    parser.add_argument("--format", choices=sorted(FORMAT_OPTIONS), help="the source format, when its name does not tell")
    parser.add_argument("--offsets", metavar="FILE.npy",
                        help="npy: N + 1 row boundaries; record k is rows offsets[k] to offsets[k + 1]")
    parser.add_argument("--dtype", help="tokens: the integer type of the token ids, e.g. uint16")
    parser.add_argument("--separator", type=int, metavar="TOKEN",
                        help="tokens: the token id that ends each document; it stays the document's last token")
    parser.add_argument("--drop-separator", action="store_true", default=None,
                        help="tokens: leave the separator tokens out of the records")
    parser.add_argument("--field", help="jsonl, parquet: store only this text (or binary) field of each sample; a dotted "
                        "path such as meta.caption reaches into nested maps (Parquet struct columns), a key holding a "
                        "dot such as \"a.b\" being found first, as dump --field finds it")
    parser.add_argument("--skip-null", action="store_true", default=None,
                        help="jsonl, parquet with --field: leave out the samples whose field is null (default: refuse them)")
    parser.add_argument("--labels", action="store_true", default=None,
                        help='folder: label each file by its sub-folder, as torchvision\'s ImageFolder does: records '
                        '{"image", "label", "path"} and the sorted sub-folder names as metadata "labels"; hidden '
                        'entries (.DS_Store, .ipynb_checkpoints/) are left out')
    parser.add_argument("--codec", choices=("str", "bytes"),
                        help="text, and jsonl or parquet with --field: store str records (default) or UTF-8 bytes")
    parser.add_argument("--max-shard-bytes", type=byte_size, default=256 << 20, metavar="SIZE",
                        help="start a new shard before one grows past SIZE of payload, e.g. 64M, 1G (default 256M)")
    parser.add_argument("--max-shard-records", type=positive_int, metavar="N", help="at most N records per shard")
    parser.add_argument("--max-record-bytes", type=byte_size, metavar="SIZE",
                        help="jsonl, text, folder: refuse a line or file longer than SIZE (default 64M)")
    parser.add_argument("--metadata", type=json_object, metavar="JSON", help="user metadata, a JSON object")
    parser.add_argument("--overwrite", action="store_true", help="replace a dataset already at DST")
    parser.add_argument("--workers", type=positive_int, default=1, metavar="N",
                        help="convert N parts of SRC in N processes (default 1); the records are the same, in the same order")
    add_allow_other_files_option(parser)
    add_quiet_option(parser)
    add_location_options(parser, cache=False)
    parser.set_defaults(run=run)


def _check_destination_outside(destination: str, folder: str, role: str) -> None:
    """Refuse to write DST into a folder convert reads, `role` (the source folder, or a class folder, which may be a
    link to anywhere): its own files (shards, journal, lock) would become records."""
    real, target = os.path.realpath(folder), os.path.realpath(destination)
    if os.path.commonpath([real, target]) == real:
        where = "is" if real == target else "lies inside"
        linked = f" (a link to {real})" if os.path.islink(folder) else ""
        raise UsageError(f"DST {destination} {where} {role} {folder}{linked}; convert would read its own output: "
                         "write the dataset outside the folders it reads")


def _source_options(args: argparse.Namespace) -> dict[str, Any]:
    """The source options given (plain values, which a worker process opens the source with)."""
    return {option: getattr(args, option) for option in SOURCE_OPTIONS if getattr(args, option) is not None}


def _open_source(args: argparse.Namespace) -> tuple[Source, str]:
    """The source the arguments describe, with every option checked against its format, and its format."""
    if not os.path.exists(args.source):
        raise CommandError(f"{args.source}: no such file or folder")
    kind = source_format(args.source, args.format)
    if kind == "folder" and os.path.isdir(args.source):
        _check_destination_outside(args.destination, args.source, "the source folder")
    source = open_source(args.source, kind, _source_options(args))
    if isinstance(source, FolderSource):
        for class_folder in source.class_folders:  # a linked one may lead anywhere, DST included
            _check_destination_outside(args.destination, class_folder, "the class folder")
    return source, kind


_EXISTING_DATASET = "a dataset, or the shards of an interrupted writer, is already there; pass --overwrite to replace it"


def _dataset_writer(args: argparse.Namespace, source: Source) -> varstore.ShardedWriter:
    """The writer of DST; its refusal to replace what is there is worded for the command line (convert
    always starts again: it has no resume)."""
    metadata = conversion.dataset_metadata(source, args.metadata)
    try:
        return varstore.ShardedWriter(
            args.destination, codec=source.codec, dtype=source.dtype, shape=source.shape, metadata=metadata,
            max_shard_bytes=args.max_shard_bytes, max_shard_records=args.max_shard_records, overwrite=args.overwrite,
            **({"storage_options": args.storage_options} if is_url(args.destination) else {}),
        )
    except varstore.ShardExistsError as error:
        raise CommandError(f"{error.path}: {_EXISTING_DATASET}") from None


def _local_destination(args: argparse.Namespace) -> ContextManager[None]:
    """A local DST directory is removed again if convert created it and fails; a URL has no directory to remove."""
    return nullcontext() if is_url(args.destination) else removed_if_created_and_failed(args.destination)


def _convert_serially(args: argparse.Namespace, source: Source) -> None:
    # The writer locks DST for the whole run, and on an error removes every shard it wrote.
    with _local_destination(args), _dataset_writer(args, source) as writer:
        if not is_url(args.destination):
            check_destination(args.destination, command="convert", keeps_dataset=True, allow_other_files=args.allow_other_files)
        with progress_bar(source.total, description="convert", unit=source.unit, quiet=args.quiet) as progress:
            source.write_to(writer, progress)


def _convert_in_parts(args: argparse.Namespace, source: Source, kind: str) -> None:
    """--workers N: the parts written by worker processes and committed in order (`varstore.conversion`)."""
    with _local_destination(args):
        if not is_url(args.destination):
            make_directories(args.destination)
            check_destination(args.destination, command="convert", keeps_dataset=True, allow_other_files=args.allow_other_files)
        with progress_bar(source.total, description="convert", unit=source.unit, quiet=args.quiet) as progress:
            try:
                conversion.write_in_parts(
                    source, args.source, kind, _source_options(args), args.destination, workers=args.workers,
                    metadata=args.metadata, overwrite=args.overwrite, max_shard_bytes=args.max_shard_bytes,
                    max_shard_records=args.max_shard_records, progress=progress,
                    storage_options=args.storage_options if is_url(args.destination) else None,
                )
            except varstore.ShardExistsError as error:
                raise CommandError(f"{args.destination}: {_EXISTING_DATASET}") from None


def run(args: argparse.Namespace) -> int:
    check_location_options(args, args.destination)
    source, kind = _open_source(args)
    started = time.perf_counter()
    if args.workers == 1:
        _convert_serially(args, source)
    else:
        _convert_in_parts(args, source, kind)
    seconds = time.perf_counter() - started
    with open_store(args.destination, args) as dataset:
        payload = sum(entry.data_size for entry in dataset.manifest.shards)
        shards = len(dataset.manifest.shards)
        records = len(dataset)
    skipped = f"; left out {plural(source.skipped, 'sample')} whose {args.field} is null" if source.skipped else ""
    print(f"wrote {plural(records, 'record')} in {plural(shards, 'shard')} ({format_size(payload)}) "
          f"to {args.destination} in {seconds:.2f} s{skipped}")
    return 0

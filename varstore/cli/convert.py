"""``varstore convert``: build a dataset from .npy arrays, raw token files, JSON Lines, text, folders of files or Parquet."""

from __future__ import annotations

import argparse
import time
from functools import partial
from typing import Any

from ..conversion.driver import run_conversion
from ..conversion.sources import FORMAT_OPTIONS, SOURCE_OPTIONS
from ..conversion.tfrecord import COMPRESSION_TYPES
from ..errors import CommandError, ShardExistsError, UsageError
from ..format.compression import CHOICES, DICTIONARY_LEVEL_BONUS, MAX_LEVEL, MIN_LEVEL
from ..local.file_url import resolve_file_url
from ..operations.locations import is_url
from .arguments import (
    add_allow_other_files_option,
    add_quiet_option,
    byte_size,
    command_parser,
    json_object,
    positive_int,
)
from .output import format_size, plural, progress_bar
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
  SHARDS.tar       webdataset: one msgpack record per sample {"__key__": key, EXT: bytes, ...}, grouped
                   as WebDataset groups them (consecutive members sharing the name up to the first
                   dot); every field is bytes unless --decode; .tar, .tar.gz, .tgz (bzip2, xz too)
  FILE.tfrecord    tfrecord: one msgpack record per tf.train.Example ({feature: bytes or [bytes],
                   float32 array or int64 array}), or each record's bytes with --codec bytes; both
                   CRCs checked; .tfrecord, .tfrecords, .tfrec, and .gz of them (gzip)
  webdataset and tfrecord SRC may name many files, as WebDataset users name shards: brace
  lists and ranges (shard-{000..009}.tar), globs (shards/*.tfrecord), A::B lists, and URLs
  (s3://bucket/shard-{000..099}.tar; --storage-options reach SRC's filesystem)
  DIR/ or FILE.arrow  huggingface (--format huggingface for a save_to_disk folder or .parquet): one msgpack
                   record per row, binary as bytes, lists of numbers as arrays, Image/Audio as their encoded
                   bytes; or one --field column (str, bytes, or ndarray for a list of numbers); needs pyarrow
  DIR/             mds (--format mds): a MosaicML MDS folder (index.json + shards, zstd/gz/bz2 compressed or
                   not): one msgpack record per sample; pkl columns refused unless --allow-pickle
  DIR/             litdata (--format litdata): a litdata chunk folder (index.json + chunk-*.bin, zstd or
                   not): one msgpack record per item, its pytree rebuilt; pickle leaves as for mds

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
  varstore convert docs.jsonl docs/ --field text --compression auto
  varstore convert 'shards/shard-{000..009}.tar' images/ --workers 4
  varstore convert 'train-*.tfrecord.gz' train/

""" + REMOTE_EPILOG

_DESCRIPTION = """Build a dataset directory DST from SRC, streaming: memory stays bounded whatever the size (see
limits below)."""


def add_parser(commands: Any) -> None:
    parser = command_parser(commands, "convert", run,
                            help="build a dataset from .npy, token, JSON Lines, text, folder, Parquet, WebDataset or TFRecord sources",
                            description=_DESCRIPTION, epilog=_EPILOG)
    parser.add_argument("source", metavar="SRC", type=resolve_file_url, help="the file or folder to read")
    parser.add_argument("destination", metavar="DST", type=resolve_file_url,
                        help="the dataset directory to write, or a URL of object storage")
    parser.add_argument("--format", choices=sorted(FORMAT_OPTIONS), help="the source format, when its name does not tell")
    parser.add_argument("--offsets", metavar="FILE.npy",
                        help="npy: N + 1 row boundaries; record k is rows offsets[k] to offsets[k + 1]")
    parser.add_argument("--dtype", help="tokens: the integer type of the token ids, e.g. uint16")
    parser.add_argument("--separator", type=int, metavar="TOKEN",
                        help="tokens: the token id that ends each document; it stays the document's last token")
    parser.add_argument("--drop-separator", action="store_true", default=None,
                        help="tokens: leave the separator tokens out of the records")
    parser.add_argument("--field", help="jsonl, parquet, huggingface: store only this text (or binary) field of each sample; a dotted "
                        "path such as meta.caption reaches into nested maps (Parquet struct columns), a key holding a "
                        "dot such as \"a.b\" being found first, as dump --field finds it")
    parser.add_argument("--skip-null", action="store_true", default=None,
                        help="jsonl, parquet with --field: leave out the samples whose field is null (default: refuse them)")
    parser.add_argument("--labels", action="store_true", default=None,
                        help='folder: label each file by its sub-folder, as torchvision\'s ImageFolder does: records '
                        '{"image", "label", "path"} and the sorted sub-folder names as metadata "labels"; hidden '
                        'entries (.DS_Store, .ipynb_checkpoints/) are left out')
    parser.add_argument("--codec", choices=("str", "bytes"),
                        help="text, and jsonl or parquet with --field: store str records (default) or UTF-8 bytes; "
                        "tfrecord: bytes keeps each record's bytes instead of decoding its tf.train.Example")
    parser.add_argument("--decode", action="store_true", default=None,
                        help="webdataset: decode .txt/.text/.transcript as str, .cls/.cls2/.index/.inx/.id as int and "
                        ".json/.jsn as JSON, as WebDataset's basic handlers do (default: every field stays bytes)")
    parser.add_argument("--compression-type", choices=COMPRESSION_TYPES, type=str.upper,
                        help="tfrecord: GZIP or NONE, as TensorFlow's TFRecordDataset takes it (default: GZIP for "
                        "names ending .gz)")
    parser.add_argument("--allow-pickle", action="store_true", default=None,
                        help="mds, litdata: unpickle pkl columns (this runs code the file chooses: only for files you trust)")
    parser.add_argument("--max-shard-bytes", type=byte_size, default=256 << 20, metavar="SIZE",
                        help="start a new shard before one grows past SIZE of payload, e.g. 64M, 1G (default 256M)")
    parser.add_argument("--max-shard-records", type=positive_int, metavar="N", help="at most N records per shard")
    parser.add_argument("--max-record-bytes", type=byte_size, metavar="SIZE",
                        help="jsonl, text, folder: refuse a line or file longer than SIZE (default 64M)")
    parser.add_argument("--compression", choices=("none", *CHOICES), default="none",
                        help="store each record as a zstd frame: zstd, zstd-dict (with a dictionary trained on each "
                        "shard's first records); or blocks of ~8 KiB of records as one frame each, for small records: "
                        "zstd-blocks, zstd-dict-blocks; or auto (measured on those records); needs the zstd extra "
                        "(default none)")
    parser.add_argument("--compression-level", type=positive_int, metavar="N",
                        help=f"the zstd level, {MIN_LEVEL} to {MAX_LEVEL} (default 3; a shard with a dictionary is compressed "
                        f"{DICTIONARY_LEVEL_BONUS} levels higher, at most {MAX_LEVEL})")
    parser.add_argument("--metadata", type=json_object, metavar="JSON", help="user metadata, a JSON object")
    parser.add_argument("--overwrite", action="store_true", help="replace a dataset already at DST")
    parser.add_argument("--workers", type=positive_int, default=1, metavar="N",
                        help="convert N parts of SRC in N processes (default 1); the records are the same, in the same order")
    add_allow_other_files_option(parser)
    add_quiet_option(parser)
    add_location_options(parser, cache=False)


def _source_options(args: argparse.Namespace) -> dict[str, Any]:
    """The source options given (plain values, which a worker process opens the source with); --storage-options
    reach a SRC URL's filesystem too."""
    options = {option: getattr(args, option) for option in SOURCE_OPTIONS if getattr(args, option, None) is not None}
    if is_url(args.source) and args.storage_options is not None:
        options["source_storage_options"] = args.storage_options
    return options


_EXISTING_DATASET = "a dataset, or the shards of an interrupted writer, is already there; pass --overwrite to replace it"


def run(args: argparse.Namespace) -> int:
    check_location_options(args, args.destination, args.source)
    if args.compression_level is not None and args.compression == "none":
        raise UsageError("--compression-level applies to compressed shards: give --compression zstd, zstd-dict or auto")
    started = time.perf_counter()
    try:
        conversion = run_conversion(
            args.source, args.destination, format=args.format, source_options=_source_options(args),
            workers=args.workers, metadata=args.metadata, overwrite=args.overwrite, max_shard_bytes=args.max_shard_bytes,
            max_shard_records=args.max_shard_records, allow_other_files=args.allow_other_files,
            storage_options=args.storage_options if is_url(args.destination) else None,
            compression=None if args.compression == "none" else args.compression,
            compression_level=3 if args.compression_level is None else args.compression_level, progress=partial(progress_bar, description="convert", quiet=args.quiet),
        )
    except ShardExistsError as error:  # convert always starts again (it has no resume): say so in the command's words
        raise CommandError(f"{error.path}: {_EXISTING_DATASET}") from None
    seconds = time.perf_counter() - started
    # --storage-options given for a SRC URL do not reach a local DST
    with open_store(args.destination, args if is_url(args.destination) else argparse.Namespace()) as dataset:
        payload = sum(entry.data_size for entry in dataset.manifest.shards)
        shards = len(dataset.manifest.shards)
        records = len(dataset)
    skipped = f"; left out {plural(conversion.skipped, 'sample')} whose {args.field} is null" if conversion.skipped else ""
    print(f"wrote {plural(records, 'record')} in {plural(shards, 'shard')} ({format_size(payload)}) "
          f"to {args.destination} in {seconds:.2f} s{skipped}")
    return 0

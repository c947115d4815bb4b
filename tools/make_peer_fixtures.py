"""Write the peer fixtures of tests/data/: MDS folders by MosaicML's own MDSWriter and litdata folders by litdata's
own writer, holding the samples tests/peer_samples.py defines, so the suite checks varstore's converters against
files the peers wrote without needing the peers installed.

mosaicml-streaming cannot be installed beside torch 2.13 (it pins numpy<2.2), and ``import streaming`` needs
torchvision; its writer needs neither, so its parent packages are entered here as bare namespaces (their
``__init__`` files, which import the loader, are not run). Run in the bench venv, which has both peers:

    .venv-bench/bin/python tools/make_peer_fixtures.py
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
sys.path.insert(0, str(ROOT))

from tests import peer_samples  # the checkout is on the path only from here


def mds_writer() -> type:
    """MosaicML's MDSWriter, imported without running ``streaming/__init__.py`` (which needs torchvision)."""
    spec = importlib.util.find_spec("streaming")
    assert spec is not None and spec.submodule_search_locations, "mosaicml-streaming is not installed"
    root = spec.submodule_search_locations[0]
    for name, folder in (("streaming", ""), ("streaming.base", "base"), ("streaming.base.format", "base/format")):
        package = types.ModuleType(name)
        package.__path__ = [os.path.join(root, folder)]
        sys.modules.setdefault(name, package)
    from streaming.base.format.mds.writer import MDSWriter

    return MDSWriter


def write_mds() -> None:
    writer_class = mds_writer()
    folders = {"plain": None, "zstd": "zstd:7", "gzip": "gz"}
    for name, compression in folders.items():
        out = DATA / "mds" / name
        shutil.rmtree(out, ignore_errors=True)
        # A small size limit so the samples span several shards.
        with writer_class(columns=peer_samples.MDS_COLUMNS, out=str(out), compression=compression,
                          size_limit=1 << 11) as writer:
            for index in range(peer_samples.MDS_SAMPLES):
                writer.write(peer_samples.mds_sample(index))
    out = DATA / "mds" / "pickle"
    shutil.rmtree(out, ignore_errors=True)
    with writer_class(columns={"id": "int", "obj": "pkl"}, out=str(out)) as writer:
        for index in range(peer_samples.PICKLE_SAMPLES):
            writer.write(peer_samples.pickle_sample(index))


def write_mds_images() -> None:
    """An MDS folder of the image encodings: raw pixels of every mode, the image lists and jpeg_array."""
    out = DATA / "mds" / "images"
    shutil.rmtree(out, ignore_errors=True)
    with mds_writer()(columns=peer_samples.MDS_IMAGE_COLUMNS, out=str(out), size_limit=1 << 11) as writer:
        for index in range(peer_samples.MDS_IMAGE_SAMPLES):
            writer.write(peer_samples.mds_image_sample(index))


def write_litdata() -> None:
    """litdata folders by its BinaryWriter (what optimize runs in each worker), uncompressed and in each of
    its zstd layouts; the photo leaf is a JPEG file opened with Pillow, which litdata stores byte for byte."""
    import tempfile

    from litdata.streaming.writer import BinaryWriter
    from PIL import Image

    layouts = {"plain": {}, "zstd-batch": {"compression": "zstd", "compression_batch_size": 1},
               "zstd-chunk": {"compression": "zstd", "compression_level": "chunk"},
               "zstd-sample": {"compression": "zstd", "compression_level": "sample"}}
    with tempfile.TemporaryDirectory() as photos:
        for name, options in layouts.items():
            out = DATA / "litdata" / name
            shutil.rmtree(out, ignore_errors=True)
            writer = BinaryWriter(str(out), chunk_bytes=1 << 11, **options)
            for index in range(peer_samples.LITDATA_SAMPLES):
                sample = peer_samples.litdata_sample(index)
                photo = os.path.join(photos, f"{index}.jpg")
                sample["photo"].save(photo, "JPEG")
                sample["photo"] = Image.open(photo)
                writer[index] = sample
            writer.done()
            writer.merge()
    out = DATA / "litdata" / "text"
    shutil.rmtree(out, ignore_errors=True)
    writer = BinaryWriter(str(out), chunk_bytes=1 << 9)
    for index in range(peer_samples.LITDATA_SAMPLES):
        writer[index] = peer_samples.litdata_text_sample(index)
    writer.done()
    writer.merge()
    out = DATA / "litdata" / "pickle"
    shutil.rmtree(out, ignore_errors=True)
    writer = BinaryWriter(str(out), chunk_bytes=1 << 11)
    for index in range(peer_samples.PICKLE_SAMPLES):
        writer[index] = peer_samples.litdata_pickle_sample(index)
    writer.done()
    writer.merge()


def write_litdata_media() -> None:
    """A litdata folder of list samples: a JsonLeaf (litdata's binary JSON), then Video, Audio and File (PDF)
    leaves given bytes."""
    from litdata.streaming.serializers import Audio, File, JsonLeaf, Video
    from litdata.streaming.writer import BinaryWriter

    out = DATA / "litdata" / "media"
    shutil.rmtree(out, ignore_errors=True)
    writer = BinaryWriter(str(out), chunk_bytes=1 << 10)
    for index in range(peer_samples.LITDATA_SAMPLES):
        value, clip, sound, doc = peer_samples.litdata_media_sample(index)
        writer[index] = [JsonLeaf(value), Video(bytes=clip, path="clip.mp4"), Audio(bytes=sound, path="sound.wav"),
                         File(bytes=doc, path="doc.pdf")]
    writer.done()
    writer.merge()


def main() -> None:
    write_mds()
    write_mds_images()
    write_litdata()
    write_litdata_media()
    for path in sorted(DATA.rglob("*")):
        if path.is_file():
            print(f"{path.relative_to(ROOT)}: {path.stat().st_size:,} bytes")


if __name__ == "__main__":
    main()

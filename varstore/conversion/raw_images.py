"""Raw PIL images as MDS's ``pil`` encoding and litdata's PILSerializer store them (uint32 width, height and mode
length, the mode's name, then the pixels as ``Image.tobytes`` gives them), turned into PNG bytes without loss."""

from __future__ import annotations

import io
import struct

from ..errors import require_extra

_HEADER = struct.Struct("<III")
_GREYS = bytes(grey for grey in range(256) for _ in range(3))


class RawImageError(ValueError):
    """A raw image whose header or pixels do not make an image PNG can hold; the caller names where it lies."""


def png_of_raw_pixels(data: bytes, extra: str) -> bytes:
    """The raw image `data` as PNG bytes, through Pillow (from the optional `extra`); its pixel bytes must be
    exactly what its mode and size need, and a mode PNG cannot hold (CMYK, F, I...) is refused, not converted.
    A ``P`` image, whose palette the raw bytes do not keep, gets a palette of greys (index i is grey i)."""
    image_module = require_extra("PIL.Image", extra, "converting raw PIL images")
    if len(data) < _HEADER.size:
        raise RawImageError(f"a raw image of {len(data)} bytes, shorter than its header")
    width, height, mode_size = _HEADER.unpack_from(data)
    if _HEADER.size + mode_size > len(data):
        raise RawImageError(f"a raw image whose mode name of {mode_size:,} bytes runs past its {len(data):,} bytes")
    mode = data[_HEADER.size : _HEADER.size + mode_size].decode("ascii", "replace")
    pixels = memoryview(data)[_HEADER.size + mode_size :]
    try:
        row = (width + 7) // 8 if mode == "1" else width * len(image_module.new(mode, (1, 1)).tobytes())
    except ValueError:
        raise RawImageError(f"a raw image of mode {mode!r}, which is not one of Pillow's") from None
    if row * height != len(pixels):
        raise RawImageError(f"a raw {mode} image of {width}x{height} needs {row * height:,} bytes of pixels, "
                            f"and {len(pixels):,} follow its header")
    encoded = io.BytesIO()
    try:
        image = image_module.frombytes(mode, (width, height), bytes(pixels))
        if mode == "P":  # the raw bytes keep no palette: grey i for index i, so that PNG keeps every index
            image.putpalette(_GREYS)
        image.save(encoded, "PNG")
    except (ValueError, OSError) as error:
        raise RawImageError(f"a raw {mode} image of {width}x{height} that PNG cannot hold: {error}") from None
    return encoded.getvalue()

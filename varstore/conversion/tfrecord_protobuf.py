"""The fast path of `tfrecord.decode_example`: protobuf's parser (its C backend, upb, from protobuf 4) reads a ``tf.train.Example``
into a message class built here from a descriptor of TensorFlow's example.proto and feature.proto, so neither
TensorFlow nor generated code is needed. Its values are exactly the pure decoder's: a message protobuf refuses, or
one holding unknown fields (where the two read a group otherwise), is left to the pure decoder, which refuses it or
reads it as documented. Imported only by `tfrecord.example_decoder`, and only when protobuf is installed.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError

if not hasattr(message_factory, "GetMessageClass"):  # protobuf 3: the pure decoder reads instead
    raise ImportError("the TFRecord fast path needs protobuf 4 or later (pip install 'varstore[tfrecord]')")

_LABEL_REPEATED = descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED
_LABEL_OPTIONAL = descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL
_TYPES = descriptor_pb2.FieldDescriptorProto


def _example_class() -> type:
    """The class of ``tensorflow.Example``, with the field numbers and types of TensorFlow's example.proto and
    feature.proto (proto3), built from a FileDescriptorProto in a pool of its own."""
    file = descriptor_pb2.FileDescriptorProto(name="varstore/tf_example.proto", package="tensorflow", syntax="proto3")

    def message(name: str, *fields: tuple[str, int, int, int, str | None, int | None]) -> Any:
        proto = file.message_type.add(name=name)
        for field_name, number, label, kind, type_name, oneof in fields:
            field = proto.field.add(name=field_name, number=number, label=label, type=kind)
            if type_name:
                field.type_name = type_name
            if oneof is not None:
                field.oneof_index = oneof
        return proto

    message("BytesList", ("value", 1, _LABEL_REPEATED, _TYPES.TYPE_BYTES, None, None))
    message("FloatList", ("value", 1, _LABEL_REPEATED, _TYPES.TYPE_FLOAT, None, None))
    message("Int64List", ("value", 1, _LABEL_REPEATED, _TYPES.TYPE_INT64, None, None))
    feature = message("Feature", *[(name, number, _LABEL_OPTIONAL, _TYPES.TYPE_MESSAGE, f".tensorflow.{kind}", 0)
                                   for name, number, kind in [("bytes_list", 1, "BytesList"),
                                                              ("float_list", 2, "FloatList"),
                                                              ("int64_list", 3, "Int64List")]])
    feature.oneof_decl.add(name="kind")
    features = message("Features", ("feature", 1, _LABEL_REPEATED, _TYPES.TYPE_MESSAGE,
                                    ".tensorflow.Features.FeatureEntry", None))
    entry = features.nested_type.add(name="FeatureEntry")
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, label=_LABEL_OPTIONAL, type=_TYPES.TYPE_STRING)
    entry.field.add(name="value", number=2, label=_LABEL_OPTIONAL, type=_TYPES.TYPE_MESSAGE,
                    type_name=".tensorflow.Feature")
    message("Example", ("features", 1, _LABEL_OPTIONAL, _TYPES.TYPE_MESSAGE, ".tensorflow.Features", None))
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("tensorflow.Example"))


_EXAMPLE = _example_class()


def parse_example(data: bytes | memoryview) -> dict[str, Any] | None:
    """`decode_example`'s values for the serialized Example `data`, read by protobuf's parser; None for a message
    it refuses or that holds an unknown field (see the module's docstring), for the pure decoder to read."""
    example = _EXAMPLE()
    try:
        example.ParseFromString(data)
    except DecodeError:
        return None
    size = example.ByteSize()
    example.DiscardUnknownFields()
    if example.ByteSize() != size:  # an unknown field somewhere
        return None
    values: dict[str, Any] = {}
    entries = example.features.feature
    for name in sorted(entries):
        feature = entries[name]
        kind = feature.WhichOneof("kind")
        if kind == "bytes_list":
            found = list(feature.bytes_list.value)
            values[name] = found[0] if len(found) == 1 else found
        elif kind == "float_list":
            values[name] = np.array(feature.float_list.value, np.float32)  # a NaN's bits kept (a test checks)
        elif kind == "int64_list":
            values[name] = np.array(feature.int64_list.value, np.int64)
        else:
            values[name] = None
    return values

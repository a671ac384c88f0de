#!/usr/bin/env python3
"""The upstream TraceConfig schema as a FileDescriptorSet, for `--txt`.

Run by hand (never at build time), from the repository root:

    pip install perfetto==0.59.1 protobuf
    python3 host-service/cli/src/schema/gen_trace_config.py

It reads the trace schema that the official `perfetto` PyPI package ships
(`perfetto_trace_pb2`, whose file declares TraceConfig, DataSourceConfig and
every data-source config) and writes `trace_config.fds.bin` next to this
script: one file, package perfetto.protos, holding perfetto.protos.TraceConfig
and every message and enum it reaches, nothing else. Only names, numbers,
types, labels, oneofs, nesting and the two options that change the wire
format or the schema's validity (`packed`, `allow_alias`) are kept; no
comments, source info, defaults or other options.

    python3 host-service/cli/src/schema/gen_trace_config.py --encode FILE

prints, as hex, the bytes the official python protobuf encodes the
text-format TraceConfig in FILE to (the expected values of the text-config
tests in host-service/cli/tests/cli_config.rs were made this way).
"""

import argparse
import os
import sys

from google.protobuf import descriptor_pb2, text_format
from perfetto.protos.perfetto.trace import perfetto_trace_pb2

ROOT = ".perfetto.protos.TraceConfig"
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "trace_config.fds.bin")
FILE_NAME = "perfetto/trace_config.proto"


def index(file):
    """Full name -> (DescriptorProto or EnumDescriptorProto) for every type."""
    types = {}

    def walk(messages, enums, prefix):
        for e in enums:
            types[prefix + e.name] = e
        for m in messages:
            types[prefix + m.name] = m
            walk(m.nested_type, m.enum_type, prefix + m.name + ".")

    walk(file.message_type, file.enum_type, "." + file.package + ".")
    return types


def reachable(types):
    seen = set()
    todo = [ROOT]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        proto = types[name]
        if isinstance(proto, descriptor_pb2.DescriptorProto):
            todo.extend(f.type_name for f in proto.field if f.type_name)
    return seen


def strip_field(f):
    out = descriptor_pb2.FieldDescriptorProto(
        name=f.name, number=f.number, label=f.label, type=f.type
    )
    if f.type_name:
        out.type_name = f.type_name
    if f.HasField("oneof_index"):
        out.oneof_index = f.oneof_index
    if f.options.packed:
        out.options.packed = True
    return out


def strip_enum(e):
    out = descriptor_pb2.EnumDescriptorProto(name=e.name)
    for v in e.value:
        out.value.add(name=v.name, number=v.number)
    if e.options.allow_alias:
        out.options.allow_alias = True
    return out


def strip_message(m, prefix, keep):
    """`m` reduced to what is kept; None if neither it nor a nested type is."""
    full = prefix + m.name
    nested = [strip_message(n, full + ".", keep) for n in m.nested_type]
    nested = [n for n in nested if n is not None]
    enums = [strip_enum(e) for e in m.enum_type if full + "." + e.name in keep]
    if full not in keep and not nested and not enums:
        return None
    out = descriptor_pb2.DescriptorProto(name=m.name)
    out.nested_type.extend(nested)
    out.enum_type.extend(enums)
    if full in keep:
        out.field.extend(strip_field(f) for f in m.field)
        out.oneof_decl.extend(descriptor_pb2.OneofDescriptorProto(name=o.name) for o in m.oneof_decl)
    return out


def generate():
    source = descriptor_pb2.FileDescriptorProto()
    perfetto_trace_pb2.DESCRIPTOR.CopyToProto(source)
    keep = reachable(index(source))
    prefix = "." + source.package + "."
    file = descriptor_pb2.FileDescriptorProto(
        name=FILE_NAME, package=source.package, syntax="proto2"
    )
    for m in source.message_type:
        stripped = strip_message(m, prefix, keep)
        if stripped is not None:
            file.message_type.append(stripped)
    file.enum_type.extend(strip_enum(e) for e in source.enum_type if prefix + e.name in keep)
    fds = descriptor_pb2.FileDescriptorSet()
    fds.file.append(file)
    data = fds.SerializeToString(deterministic=True)
    with open(OUT, "wb") as f:
        f.write(data)
    messages = sum(1 for n in keep if isinstance(index(source)[n], descriptor_pb2.DescriptorProto))
    print(f"{OUT}: {len(data)} bytes, {messages} messages, {len(keep) - messages} enums")


def encode(path):
    config = perfetto_trace_pb2.TraceConfig()
    with open(path) as f:
        text_format.Parse(f.read(), config)
    print(config.SerializeToString(deterministic=True).hex())


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--encode", metavar="FILE", help="print the bytes of a text-format TraceConfig")
    args = parser.parse_args()
    if args.encode:
        encode(args.encode)
    else:
        generate()


if __name__ == "__main__":
    sys.exit(main())

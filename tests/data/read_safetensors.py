#!/usr/bin/env python3
"""An independent reader and writer of safetensors files, from the format's specification alone
(8-byte little-endian header length N, N bytes of UTF-8 JSON, then the packed little-endian
row-major data), using only the standard library. It shares no code with tapegrad, so a mistake
in tapegrad's reading of the specification shows up as a disagreement here.

  read_safetensors.py check FILE   parse FILE (written by test_checkpoint's interop/write_for_python)
                                   and compare every name, dtype, shape, value and the metadata
                                   with what that test wrote
  read_safetensors.py write FILE   write FILE by hand for test_checkpoint's interop/read_from_python,
                                   laid out unlike tapegrad's writer (key order, whitespace, escaped
                                   Unicode, data in another order than the header, no padding)

ctest runs both (tests/checkpoint.cmake); the expected values below and those in
tests/test_checkpoint.cpp must be kept in step.
"""
import json
import math
import struct
import sys

# dtype code -> (struct format character, bytes per element)
DTYPES = {"F32": ("f", 4), "F64": ("d", 8), "BOOL": ("?", 1), "I64": ("q", 8)}


class FormatProblem(Exception):
    pass


def require(condition, message):
    if not condition:
        raise FormatProblem(message)


def parse(path):
    """Returns (header length, [(name, dtype, shape, begin, end, raw bytes)] in header order, metadata)."""
    with open(path, "rb") as f:
        data = f.read()
    require(len(data) >= 8, f"file is {len(data)} bytes, shorter than the length field")
    (n,) = struct.unpack("<Q", data[:8])
    require(8 + n <= len(data), f"header length {n} runs past the end of the {len(data)}-byte file")
    header_bytes = data[8 : 8 + n]
    require(header_bytes[:1] == b"{", "the header must begin with '{'")
    text = header_bytes.decode("utf-8")  # strict: invalid UTF-8 raises

    def no_duplicates(pairs):
        keys = [k for k, _ in pairs]
        require(len(keys) == len(set(keys)), f"duplicate keys in {keys}")
        return dict(pairs)  # dicts keep insertion (= file) order

    header = json.loads(text, object_pairs_hook=no_duplicates)
    require(isinstance(header, dict), "the header is not a JSON object")
    metadata = header.pop("__metadata__", {})
    require(all(isinstance(v, str) for v in metadata.values()), "metadata values must be strings")
    buffer = data[8 + n :]
    tensors = []
    for name, info in header.items():
        require(set(info) == {"dtype", "shape", "data_offsets"}, f"{name}: keys {sorted(info)}")
        require(info["dtype"] in DTYPES, f"{name}: unexpected dtype {info['dtype']}")
        shape, (begin, end) = info["shape"], info["data_offsets"]
        require(all(isinstance(d, int) and d >= 0 for d in shape), f"{name}: bad shape {shape}")
        require(0 <= begin <= end <= len(buffer), f"{name}: data_offsets {begin, end} outside the buffer")
        require(end - begin == math.prod(shape) * DTYPES[info["dtype"]][1], f"{name}: byte count does not match shape")
        tensors.append((name, info["dtype"], shape, begin, end, buffer[begin:end]))
    position = 0
    for begin, end in sorted((t[3], t[4]) for t in tensors):
        require(begin == position, f"data bytes [{position}, {begin}) are not covered exactly once")
        position = end
    require(position == len(buffer), f"data bytes [{position}, {len(buffer)}) belong to no tensor")
    return n, tensors, metadata


def values(dtype, shape, raw):
    code, _ = DTYPES[dtype]
    return list(struct.unpack(f"<{math.prod(shape)}{code}", raw))


# What test_checkpoint's interop/write_for_python writes: name, dtype, shape, exact bytes.
FROM_CPP = [
    ("f32", "F32", [2, 3], struct.pack("<6f", 0.5, -1.25, 1.5 * 2.0**127, -0.0, math.inf, 2.0**-149)),
    ("f64", "F64", [3], struct.pack("<ddQ", 1 / 3, -1e308, 0x7FF8000000000001)),
    ("mask", "BOOL", [2, 2], bytes([1, 0, 0, 1])),
    ("ids", "I64", [4], struct.pack("<4q", -(2**63), -1, 0, 2**63 - 1)),
    ("transposed", "F32", [3, 2], struct.pack("<6f", 0, 3, 1, 4, 2, 5)),
    ("empty", "F64", [2, 0], b""),
    ("scalar", "I64", [], struct.pack("<q", 42)),
    ("unicode/名前.ß", "F32", [1], struct.pack("<f", 7)),
]
FROM_CPP_METADATA = {"format": "pt", "step": "1000", "note": 'ünïcode "quoted"\n'}


def check(path):
    n, tensors, metadata = parse(path)
    problems = []
    if n % 8:
        problems.append(f"header length {n} is not a multiple of 8 (tapegrad pads it)")
    with open(path, "rb") as f:
        header = f.read(8 + n)[8:]
    if not header.rstrip(b" ").endswith(b"}"):
        problems.append("the header padding is not spaces")
    names = [t[0] for t in tensors]
    if names != [e[0] for e in FROM_CPP]:
        problems.append(f"names in header order: {names}")
    got = {t[0]: t for t in tensors}
    for name, dtype, shape, raw in FROM_CPP:
        if name not in got:
            continue
        _, gdtype, gshape, begin, _, graw = got[name]
        if (gdtype, gshape) != (dtype, shape):
            problems.append(f"{name}: {gdtype} {gshape}, expected {dtype} {shape}")
        elif graw != raw:
            problems.append(f"{name}: values {values(gdtype, gshape, graw)}, expected {values(dtype, shape, raw)}")
        if begin % DTYPES[gdtype][1]:
            problems.append(f"{name}: data starts at {begin}, not a multiple of its element size")
    if metadata != FROM_CPP_METADATA:
        problems.append(f"metadata {metadata}, expected {FROM_CPP_METADATA}")
    for p in problems:
        print(f"read_safetensors.py: {path}: {p}", file=sys.stderr)
    if not problems:
        print(f"read_safetensors.py: {path}: {len(tensors)} tensors and {len(metadata)} metadata entries as expected")
    return 1 if problems else 0


# What test_checkpoint's interop/read_from_python expects.
FOR_CPP = [
    ("py.f32", "F32", [2, 2], struct.pack("<4f", 1.5, -2.0, 0.25, 1024.0)),
    ("py.f64", "F64", [3], struct.pack("<3d", 0.1, -0.0, 1e300)),
    ("py.bool", "BOOL", [3], bytes([1, 0, 1])),
    ("py.i64", "I64", [2, 1], struct.pack("<2q", -5, 2**40)),
    ("py.empty", "I64", [0], b""),
    ("py.scalar", "F64", [], struct.pack("<d", 2.5)),
]
FOR_CPP_METADATA = {"written_by": "read_safetensors.py", "ünï": "ß"}


def write(path):
    # Data in reverse header order, so offsets do not follow the header; keys in another order
    # than tapegrad writes them; __metadata__ last; non-ASCII escaped as \\uXXXX; no padding.
    header, data = {}, b""
    for name, dtype, shape, raw in reversed(FOR_CPP):
        header[name] = {"data_offsets": [len(data), len(data) + len(raw)], "shape": shape, "dtype": dtype}
        data += raw
    header = {name: header[name] for name, *_ in FOR_CPP}
    header["__metadata__"] = FOR_CPP_METADATA
    text = json.dumps(header, indent=1, ensure_ascii=True).encode("utf-8")
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)
    print(f"read_safetensors.py: wrote {path} ({len(FOR_CPP)} tensors, header {len(text)} bytes)")
    return 0


def main(argv):
    if len(argv) != 3 or argv[1] not in ("check", "write"):
        print(__doc__, file=sys.stderr)
        return 2
    try:
        return check(argv[2]) if argv[1] == "check" else write(argv[2])
    except (FormatProblem, ValueError, OSError) as e:  # json errors are ValueErrors
        print(f"read_safetensors.py: {argv[2]}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))

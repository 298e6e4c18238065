#!/usr/bin/python3
"""An independent safetensors implementation, written only from the format description.

  write_reference_safetensors.py write OUT   writes the reference tensors to OUT
  write_reference_safetensors.py verify IN   reads IN with this reader, checks every value

Format: 8-byte little-endian u64 N, N bytes of UTF-8 JSON header
{"__metadata__": {str: str}, name: {"dtype", "shape", "data_offsets": [begin, end]}}, the
header padded with spaces to a multiple of 8, then the tensors' raw little-endian bytes.

Encoding and decoding use only struct and json. torch (Debian's python3-torch: run this with
/usr/bin/python3) only produces the reference values, e.g. the bits of a bfloat16. The C++ test
(safetensors_test.cc) holds the same values as literals, reads the committed fixture written by
`write`, and runs `verify` on a file written by the C++ writer.
Regenerate the fixture with:
  /usr/bin/python3 write_reference_safetensors.py write reference.safetensors
"""

import json
import math
import struct
import sys

import torch

METADATA = {
    "format": "pt",
    "producer": "write_reference_safetensors.py",
    "note": "snowman \u2603, \"quotes\" and \\backslash",
}

# struct format and size of one element, per dtype. BF16 travels as its 16 raw bits.
FORMATS = {
    "F64": ("d", 8), "F32": ("f", 4), "F16": ("e", 2), "BF16": ("H", 2),
    "I64": ("q", 8), "I32": ("i", 4), "I16": ("h", 2), "I8": ("b", 1),
    "U8": ("B", 1), "BOOL": ("?", 1),
}


def reference_tensors():
    """[(name, dtype, shape, flat list of values)] in file order: deliberately not sorted."""
    f32 = torch.tensor([[-1.5, -0.0, 0.1],
                        [3.4028234663852886e38, 1e-45, float("inf")]], dtype=torch.float32)
    f64 = torch.tensor([math.pi, -math.e, 5e-324, float("-inf"), float("nan")],
                       dtype=torch.float64)
    # Bits as unsigned 16-bit values, via torch's own rounding (round to nearest even).
    bf16 = [b & 0xFFFF for b in torch.tensor([1.0, -2.5, 0.1, 3.0e38], dtype=torch.bfloat16)
            .view(torch.int16).tolist()]
    f16 = torch.tensor([1.0, -0.5, 65504.0, 0.1], dtype=torch.float16)
    return [
        ("weight_f32", "F32", [2, 3], f32.flatten().tolist()),
        ("ids_i64", "I64", [3], [-(2 ** 63), 2 ** 63 - 1, 42]),
        ("bf16", "BF16", [2, 2], bf16),
        ("double_f64", "F64", [5], f64.tolist()),
        ("bytes_u8", "U8", [5], [0, 1, 127, 128, 255]),
        ("mask_bool", "BOOL", [2, 2], [True, False, False, True]),
        ("half_f16", "F16", [4], f16.tolist()),
        ("i32", "I32", [2], [-(2 ** 31), 2 ** 31 - 1]),
        ("i16", "I16", [2], [-(2 ** 15), 2 ** 15 - 1]),
        ("i8", "I8", [3], [-128, 0, 127]),
        ("scalar", "F32", [], [7.5]),
        ("empty", "I64", [0, 3], []),
    ]


def encode(dtype, values):
    fmt, _ = FORMATS[dtype]
    return struct.pack("<%d%s" % (len(values), fmt), *values)


def write(path):
    header = {"__metadata__": METADATA}
    data = b""
    for name, dtype, shape, values in reference_tensors():
        raw = encode(dtype, values)
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)


def read(path):
    """(metadata, {name: (dtype, shape, values)}), checking the layout rules."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    assert 8 + n <= len(blob), "header length %d exceeds the file" % n
    # Stricter than the format (which only allows padding): checks that the writer pads.
    assert n % 8 == 0, "header length %d is not a multiple of 8" % n
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    data = blob[8 + n:]
    metadata = header.pop("__metadata__", {})
    tensors = {}
    end_of_previous = 0
    for name, entry in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"]):
        begin, end = entry["data_offsets"]
        assert begin == end_of_previous, "%s: gap or overlap at %d" % (name, begin)
        fmt, size = FORMATS[entry["dtype"]]
        count = math.prod(entry["shape"])
        assert end - begin == count * size, "%s: %d bytes for %d elements" % (name, end - begin, count)
        tensors[name] = (entry["dtype"], entry["shape"],
                         list(struct.unpack("<%d%s" % (count, fmt), data[begin:end])))
        end_of_previous = end
    assert end_of_previous == len(data), "%d trailing bytes" % (len(data) - end_of_previous)
    return metadata, tensors


def same_value(dtype, a, b):
    if dtype in ("F64", "F32", "F16"):  # Bit-exact: -0.0 and NaN included.
        fmt, _ = FORMATS[dtype]
        return struct.pack("<" + fmt, a) == struct.pack("<" + fmt, b)
    return a == b


def verify(path):
    metadata, tensors = read(path)
    problems = []
    if metadata != METADATA:
        problems.append("metadata %r != %r" % (metadata, METADATA))
    expected = reference_tensors()
    if sorted(tensors) != sorted(name for name, _, _, _ in expected):
        problems.append("tensor names %s" % sorted(tensors))
    for name, dtype, shape, values in expected:
        if name not in tensors:
            continue
        got_dtype, got_shape, got_values = tensors[name]
        if (got_dtype, got_shape) != (dtype, shape):
            problems.append("%s: %s%s, expected %s%s" % (name, got_dtype, got_shape, dtype, shape))
        elif not all(same_value(dtype, a, b) for a, b in zip(got_values, values)):
            problems.append("%s: values %r, expected %r" % (name, got_values, values))
    for p in problems:
        print("MISMATCH", p)
    if problems:
        return 1
    print("OK: %d tensors and metadata match" % len(tensors))
    return 0


def main(argv):
    if len(argv) != 3 or argv[1] not in ("write", "verify"):
        print(__doc__)
        return 2
    if argv[1] == "write":
        write(argv[2])
        return 0
    return verify(argv[2])


if __name__ == "__main__":
    sys.exit(main(sys.argv))

#!/usr/bin/python3
"""Checks a `trainstep checkpoint export` against PyTorch, independently of the C++ code.

  verify_export.py CKPT_DIR OUT_DIR DTYPE

Reads CKPT_DIR/model.safetensors and the exported OUT_DIR (model.safetensors, or the shards
its model.safetensors.index.json names), parsing the format by hand (8-byte little-endian
header length, JSON header, raw bytes), and checks that every tensor of the export is torch's
`.to(DTYPE)` of the fp32 input, bit for bit; NaNs only need to stay NaN (PyTorch's own CPU
kernels disagree on their bits). Exits non-zero with the first mismatch. Run by
export_test.cc with Debian's python3 (which has torch).
"""

import json
import os
import struct
import sys

import torch

TORCH_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
EXPORT_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# Same-width integer views, to compare bits.
BITS = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n].decode("utf-8"))
    body = data[8 + n:]
    metadata = header.pop("__metadata__", {})
    tensors = {}
    for name, entry in header.items():
        begin, end = entry["data_offsets"]
        dtype = TORCH_DTYPES[entry["dtype"]]
        raw = bytearray(body[begin:end])
        t = torch.frombuffer(raw, dtype=dtype) if raw else torch.empty(0, dtype=dtype)
        tensors[name] = t.reshape(entry["shape"])
    return tensors, metadata


def main():
    ckpt, out, dtype_name = sys.argv[1:4]
    dtype = EXPORT_DTYPES[dtype_name]
    inputs, _ = read_safetensors(os.path.join(ckpt, "model.safetensors"))

    index_path = os.path.join(out, "model.safetensors.index.json")
    if os.path.exists(index_path):
        with open(index_path) as f:
            index = json.load(f)
        files = sorted(set(index["weight_map"].values()))
    else:
        index, files = None, ["model.safetensors"]
    outputs = {}
    for name in files:
        tensors, metadata = read_safetensors(os.path.join(out, name))
        if metadata.get("format") != "pt":
            sys.exit(f"{name}: metadata {metadata} lacks format pt")
        for key, t in tensors.items():
            if index is not None and index["weight_map"][key] != name:
                sys.exit(f"{key} is in {name}, the index says {index['weight_map'][key]}")
            outputs[key] = t
    if index is not None:
        total = sum(t.numel() * t.element_size() for t in outputs.values())
        if index["metadata"]["total_size"] != total:
            sys.exit(f"total_size {index['metadata']['total_size']}, the tensors hold {total}")
    if set(outputs) != set(inputs):
        sys.exit(f"tensors differ: {sorted(set(outputs) ^ set(inputs))}")

    for name, x in inputs.items():
        got = outputs[name]
        want = x.to(dtype) if x.dtype == torch.float32 else x
        if got.dtype != want.dtype or got.shape != want.shape:
            sys.exit(f"{name}: {got.dtype} {list(got.shape)}, want {want.dtype} {list(want.shape)}")
        nan = torch.isnan(want)
        if not torch.equal(torch.isnan(got), nan):
            sys.exit(f"{name}: NaNs in other places")
        got_bits = got.view(BITS[got.dtype])[~nan]
        want_bits = want.view(BITS[want.dtype])[~nan]
        if not torch.equal(got_bits, want_bits):
            i = (got_bits != want_bits).nonzero()[0].item()
            sys.exit(f"{name}: element {i} is {got_bits[i].item():#x}, torch gives "
                     f"{want_bits[i].item():#x}")

    with open(os.path.join(out, "config.json")) as f:
        config = json.load(f)
    if config.get("torch_dtype") != dtype_name or "trainstep_source_dtype" in config:
        sys.exit(f"config.json: torch_dtype {config.get('torch_dtype')}, keys {sorted(config)}")
    print(f"OK: {len(inputs)} tensors match torch")


if __name__ == "__main__":
    main()

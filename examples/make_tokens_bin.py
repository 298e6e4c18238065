#!/usr/bin/env python3
"""Writes a token file for trainstep's data.tokens: a flat array of little-endian token ids,
nanoGPT's train.bin layout. The tokenizer is bytes (id = byte value, vocabulary 256), so it
needs nothing beyond Python; numpy is used when present (Debian: python3-numpy), which is
what nanoGPT's prepare.py writes the file with.

    /usr/bin/python3 examples/make_tokens_bin.py /tmp/train.bin                # license texts
    /usr/bin/python3 examples/make_tokens_bin.py /tmp/train.bin a.txt b.txt --dtype uint32 \\
        --val /tmp/val.bin --val-fraction 0.1

Then train on it with
    "data": {"tokens": {"path": "/tmp/train.bin", "dtype": "uint16", "seq_len": 128}}
(a byte vocabulary is model.tiny_gpt's default, vocab_size 256).
"""
import argparse
import array
import glob
import os
import sys

DTYPES = {"uint16": ("<u2", "H"), "uint32": ("<u4", "I")}


def read_texts(paths):
    """The bytes of every file named (directories: every file below, sorted), concatenated.
    Raises OSError naming the file that cannot be read."""
    files = []
    for p in paths:
        if os.path.isdir(p):
            files += sorted(f for f in glob.glob(os.path.join(p, "**"), recursive=True)
                            if os.path.isfile(f))
        else:
            files.append(p)
    chunks = []
    for f in files:
        with open(f, "rb") as fh:
            chunks.append(fh.read())
    return b"".join(chunks), len(files)


def write_ids(path, ids, dtype):
    """`ids` (bytes: one id per byte) as little-endian `dtype` integers."""
    try:
        import numpy as np
        np.frombuffer(ids, dtype=np.uint8).astype(DTYPES[dtype][0]).tofile(path)
    except ImportError:
        a = array.array(DTYPES[dtype][1], iter(ids))  # one element per byte value
        assert a.itemsize == int(DTYPES[dtype][0][-1]), "unexpected C integer sizes"
        if sys.byteorder == "big":
            a.byteswap()
        with open(path, "wb") as f:
            a.tofile(f)


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", help="the token file to write (train.bin)")
    p.add_argument("texts", nargs="*", default=["/usr/share/common-licenses"],
                   help="text files or directories (default: /usr/share/common-licenses)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="uint16")
    p.add_argument("--val", help="also write the last --val-fraction of the ids here (val.bin)")
    p.add_argument("--val-fraction", type=float, default=0.1)
    a = p.parse_args()
    if not 0 < a.val_fraction < 1:
        p.error(f"--val-fraction must be between 0 and 1, got {a.val_fraction}")
    try:
        data, n_files = read_texts(a.texts)
    except OSError as e:
        p.error(f"cannot read {e.filename}: {e.strerror}")
    if len(data) < 2:
        p.error(f"the {n_files} file(s) given hold {len(data)} byte(s); a sample needs 2 ids")
    train = data
    if a.val:
        cut = len(data) - max(2, int(len(data) * a.val_fraction))
        train, val = data[:cut], data[cut:]
        write_ids(a.val, val, a.dtype)
        print(f"wrote {a.val}: {len(val)} tokens ({a.dtype})")
    write_ids(a.out, train, a.dtype)
    print(f"wrote {a.out}: {len(train)} tokens ({a.dtype}) from {n_files} file(s), byte "
          f"vocabulary (256); data.tokens: {{\"path\": \"{a.out}\", \"dtype\": \"{a.dtype}\"}}")


if __name__ == "__main__":
    main()

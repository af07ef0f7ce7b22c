#!/usr/bin/env python3
"""Xet file hashes of generated data and of the test model's files, as the Hugging Face
Hub publishes them (`xetHash` in a tree listing, `X-Xet-Hash` on a resolve), computed by
hf_xet itself: the reference `sous`'s Xet hasher is tested against
(tests/fixtures/xet/hashes.json).

    python3 -m venv /tmp/xetv && /tmp/xetv/bin/pip install hf_xet==1.8.0
    /tmp/xetv/bin/python scripts/reference/xet_fixtures.py MODEL_DIR > tests/fixtures/xet/hashes.json

The generated data is a xorshift64 byte stream (`generated(len, seed)` below, written
the same way in the Rust test), so nothing but this file and its output is committed.
"""
import json
import os
import sys
import tempfile

import hf_xet


def generated(length: int, seed: int) -> bytes:
    """`length` bytes: the low byte of each step of xorshift64 (13, 7, 17) from `seed`."""
    x = seed
    out = bytearray(length)
    for i in range(length):
        x ^= (x << 13) & 0xFFFFFFFFFFFFFFFF
        x ^= x >> 7
        x ^= (x << 17) & 0xFFFFFFFFFFFFFFFF
        out[i] = x & 0xFF
    return bytes(out)


# (name, bytes): empty, shorter than a minimum chunk, around the minimum, several
# chunks (one level of the tree), many chunks (several levels), and constant data
# (no content boundary: every chunk is cut at the maximum).
CASES = [
    ("empty", b""),
    ("hello", b"hello world"),
    ("min-1", generated(8191, 1)),
    ("min", generated(8192, 2)),
    ("300k", generated(300_000, 3)),
    ("3m", generated(3_000_000, 4)),
    ("const-1m", bytes([59]) * 1_000_000),
]


def main() -> None:
    model_dir = sys.argv[1] if len(sys.argv) > 1 else None
    result = {"hf_xet": "1.8.0", "generated": [], "model": {}}
    with tempfile.TemporaryDirectory() as tmp:
        paths = []
        for name, data in CASES:
            path = os.path.join(tmp, name)
            with open(path, "wb") as f:
                f.write(data)
            paths.append(path)
        for (name, data), info in zip(CASES, hf_xet.hash_files(paths)):
            result["generated"].append({"name": name, "len": len(data), "xet_hash": info.hash})
    if model_dir:
        files = sorted(f for f in os.listdir(model_dir) if os.path.isfile(os.path.join(model_dir, f)))
        infos = hf_xet.hash_files([os.path.join(model_dir, f) for f in files])
        for f, info in zip(files, infos):
            result["model"][f] = {"size": info.file_size, "xet_hash": info.hash}
    json.dump(result, sys.stdout, indent=2)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Product source files longer than 650 lines, which CONTRIBUTING.md asks to split by
idea. Tests (files under tests/, `tests.rs`, `*_tests.rs`) and examples may be longer.
Exits 1 when there is one.

    scripts/check/lengths.py [REPO]
"""
import os
import re
import subprocess
import sys

LIMIT = 650
NOT_PRODUCT = re.compile(r"(^|/)(tests|examples|benches)/|(^|/)tests\.rs$|_tests\.rs$")


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
    files = subprocess.run(
        ["git", "-C", root, "ls-files", "*.rs"], capture_output=True, text=True, check=True
    ).stdout.split()
    long = []
    for f in files:
        if NOT_PRODUCT.search(f):
            continue
        with open(os.path.join(root, f), encoding="utf-8") as src:
            n = sum(1 for _ in src)
        if n > LIMIT:
            long.append((n, f))
    for n, f in sorted(long, reverse=True):
        print(f"{f}: {n} lines, over {LIMIT}: split it by idea (CONTRIBUTING.md)")
    print(f"{len(long)} product files over {LIMIT} lines")
    return 1 if long else 0


if __name__ == "__main__":
    sys.exit(main())

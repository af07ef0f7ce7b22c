#!/usr/bin/env python3
"""The dev profile's list of crates that run only while compiling.

Cargo.toml builds dependencies at opt-level 2 (`[profile.dev.package."*"]`), which a
package override does for proc macros and build-script helpers too: cargo's
`build-override` loses to it. Those crates only run inside the compiler, so the dev
profile lists them back at opt-level 0 (`[profile.dev.package]`, one `NAME.opt-level = 0`
line each): the code they generate is the same, and they compile in far less time.

A crate is compile-time only when `cargo tree -e all` lists it and `cargo tree -e
normal,dev,no-proc-macro` (what the binaries and the tests link) does not. This check
fails when the list and the dependency graph disagree: a crate that now runs in a
binary must not be built at opt-level 0, and a new proc macro should join the list.

    scripts/check/host_crates.py [REPO]
"""
import os
import re
import subprocess
import sys


def packages(root, edges):
    out = subprocess.run(
        ["cargo", "tree", "--workspace", "--locked", "--offline", "-e", edges, "--prefix", "none",
         "-f", "{p}"],
        cwd=root, capture_output=True, text=True, check=True,
    ).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def listed(root):
    """The names given `opt-level = 0` in Cargo.toml's `[profile.dev.package]` table."""
    with open(os.path.join(root, "Cargo.toml"), encoding="utf-8") as f:
        text = f.read()
    table = re.search(r"^\[profile\.dev\.package\]\n(.*?)(?=^\[|\Z)", text, re.S | re.M)
    if not table:
        return set()
    return set(re.findall(r"^([A-Za-z0-9_-]+)\.opt-level\s*=\s*0\s*$", table.group(1), re.M))


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
    workspace = {"sous", "sous-engine", "sous-kernels", "sous-fake-engine"}
    host_only = packages(root, "all") - packages(root, "normal,dev,no-proc-macro") - workspace
    names = listed(root)
    missing = sorted(host_only - names)
    wrong = sorted(names - host_only)
    for name in missing:
        print(f"{name}: runs only while compiling; add `{name}.opt-level = 0` to [profile.dev.package]")
    for name in wrong:
        print(f"{name}: listed at opt-level 0 but linked into a binary or test (or gone); remove it")
    print(f"{len(names)} compile-time crates listed, {len(missing) + len(wrong)} disagreements")
    return 1 if missing or wrong else 0


if __name__ == "__main__":
    sys.exit(main())

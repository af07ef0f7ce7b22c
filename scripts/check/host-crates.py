#!/usr/bin/env python3
"""The dependencies that build only for the host (proc macros, build scripts and the
crates only they use), against the list in Cargo.toml's `[profile.dev.package]` that
gives them opt-level 0. Prints the difference and exits 1 when the list is stale.

    scripts/check/host-crates.py          # check
    scripts/check/host-crates.py --list   # print the list Cargo.toml should have

Reachability is taken from `cargo metadata` for this machine's platform: a crate is on
the target side when a workspace member reaches it through normal or dev dependencies
without passing through a proc macro; everything else that is built is host-only.
"""
import json
import os
import re
import subprocess
import sys


def host_only(root):
    host = subprocess.run(["rustc", "-vV"], capture_output=True, text=True, check=True).stdout
    triple = re.search(r"^host: (\S+)", host, re.M).group(1)
    meta = json.loads(
        subprocess.run(
            ["cargo", "metadata", "--format-version", "1", "--locked", "--filter-platform", triple],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    packages = {p["id"]: p for p in meta["packages"]}
    nodes = {n["id"]: n for n in meta["resolve"]["nodes"]}
    members = set(meta["workspace_members"])

    def proc_macro(pid):
        return any("proc-macro" in t["kind"] for t in packages[pid]["targets"])

    def reach(starts, kinds, stop_at_macros):
        seen, stack = set(), list(starts)
        while stack:
            p = stack.pop()
            if p in seen:
                continue
            seen.add(p)
            for d in nodes[p]["deps"]:
                dep_kinds = {k["kind"] for k in d["dep_kinds"]}
                if not dep_kinds & kinds:
                    continue
                if stop_at_macros and proc_macro(d["pkg"]):
                    continue
                stack.append(d["pkg"])
        return seen

    target = reach(members, {None, "dev"}, True)
    built = reach(members, {None, "dev", "build"}, False)
    return sorted({packages[p]["name"] for p in built - target})


def listed(root):
    text = open(os.path.join(root, "Cargo.toml"), encoding="utf-8").read()
    section = re.search(r"^\[profile\.dev\.package\]\n(.*?)(?=^\[|\Z)", text, re.M | re.S)
    if not section:
        return []
    return sorted(re.findall(r"^([A-Za-z0-9_-]+)\.opt-level = 0$", section.group(1), re.M))


def main():
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
    want = host_only(root)
    if "--list" in sys.argv[1:]:
        print("\n".join(f"{n}.opt-level = 0" for n in want))
        return 0
    have = listed(root)
    missing = sorted(set(want) - set(have))
    extra = sorted(set(have) - set(want))
    for n in missing:
        print(f"Cargo.toml: [profile.dev.package] lacks {n}.opt-level = 0 (it builds only for the host)")
    for n in extra:
        print(f"Cargo.toml: [profile.dev.package] lists {n}, which no longer builds only for the host")
    if missing or extra:
        print("scripts/check/host-crates.py --list prints the list to paste")
        return 1
    print(f"{len(have)} host-only crates at opt-level 0")
    return 0


if __name__ == "__main__":
    sys.exit(main())

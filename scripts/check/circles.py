#!/usr/bin/env python3
"""Import circles between the product files of the workspace's three crates.

An edge runs from a file to the file of each module its `crate::`, `super::` and `self::`
paths name (comments and inline test modules left out); edges between a module and its
ancestors or descendants are the module tree, not imports, and are ignored. A circle is
a strongly connected component of more than one file. The same is asked of each crate's
top-level modules (`bench` and `eval` may share `stats`, but not import each other).
Exits 1 when there is a circle of either kind, so a change that closes one fails
`scripts/test.sh`.

    scripts/check/circles.py [REPO]
"""
import os
import re
import subprocess
import sys

CRATES = ("cli/src", "engine/src", "kernels/src")


def is_test(path):
    return "/tests/" in path or path.endswith(("/tests.rs", "_tests.rs"))


def modules(files, base):
    """Module path (a tuple) -> file, for the product files under `base`."""
    found = {}
    for f in files:
        if not f.startswith(base + "/") or is_test(f):
            continue
        parts = f[len(base) + 1 : -3].split("/")
        if parts[-1] == "mod":
            parts = parts[:-1]
        if parts in (["lib"], ["main"]):
            parts = []
        found[tuple(parts)] = f
    return found


def paths_in(text):
    """Every `crate::`/`super::`/`self::` path, `use` groups expanded one level."""
    text = re.split(r"#\[cfg\(test\)\]\s*mod tests\s*\{", text)[0]
    text = re.sub(r"//[^\n]*", "", text)
    pattern = r"\b((?:crate|super|self)(?:::(?:super|[A-Za-z_][A-Za-z0-9_]*))*)(::\{([^;]*?)\})?"
    for m in re.finditer(pattern, text):
        head = m.group(1).split("::")
        if m.group(3):
            for item in re.split(r"[,\s]+", m.group(3)):
                item = item.strip("{} ")
                if item:
                    yield head + item.split("::")
        else:
            yield head


def edges(root):
    listed = subprocess.run(
        ["git", "-C", root, "ls-files", "*.rs"], capture_output=True, text=True, check=True
    ).stdout.split()
    graph = {}
    for base in CRATES:
        mods = modules(listed, base)
        by_file = {f: m for m, f in mods.items()}

        def resolve(path):
            for n in range(len(path), -1, -1):
                if tuple(path[:n]) in mods:
                    return mods[tuple(path[:n])]
            return None

        for mod, f in mods.items():
            with open(os.path.join(root, f), encoding="utf-8") as src:
                text = src.read()
            for p in paths_in(text):
                if p[0] == "crate":
                    target = p[1:]
                else:
                    cur, i = list(mod), 0
                    if p[0] == "self":
                        i = 1
                    while i < len(p) and p[i] == "super":
                        cur, i = cur[:-1], i + 1
                    target = cur + p[i:]
                t = resolve(target)
                if t is None or t == f:
                    continue
                a, b = mod, by_file[t]
                if a[: len(b)] == b or b[: len(a)] == a:
                    continue
                graph.setdefault(f, set()).add(t)
    return graph


def circles(graph):
    """Tarjan's strongly connected components of more than one node."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def top_level(graph):
    """The file graph folded onto each crate's top-level modules (`cli/src/bench`)."""
    def top(f):
        for base in CRATES:
            if f.startswith(base + "/"):
                return base + "/" + f[len(base) + 1 : -3].split("/")[0]
        return f

    folded = {}
    for a, targets in graph.items():
        for b in targets:
            if top(a) != top(b):
                folded.setdefault(top(a), set()).add(top(b))
    return folded


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..")
    graph = edges(root)
    found = circles(graph)
    for c in found:
        print(" <-> ".join(c))
    print(f"{len(found)} import circles")
    between = circles(top_level(graph))
    for c in between:
        print(" <-> ".join(c))
    print(f"{len(between)} import circles between top-level modules")
    return 1 if found or between else 0


if __name__ == "__main__":
    sys.exit(main())

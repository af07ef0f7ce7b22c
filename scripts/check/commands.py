#!/usr/bin/env python3
"""Commands that reach into other commands. Each file under cli/src/commands/ is the
glue of one command: it parses flags, calls the `sous` library and says what
happened (issue 62). What two commands share belongs in the library, or in
commands/mod.rs; a command file naming a sibling command's module
(`super::<cmd>::`, `super::super::<cmd>::` from a command's own folder, or
`crate::commands::<cmd>`) is an offence. Comments are left out. Exits 1 when there
is one.

    scripts/check/commands.py [REPO]
"""
import os
import re
import sys

COMMANDS = os.path.join("cli", "src", "commands")
COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
    base = os.path.join(root, COMMANDS)
    names = sorted(f[:-3] for f in os.listdir(base) if f.endswith(".rs") and f != "mod.rs")
    alt = "|".join(map(re.escape, names))
    # A sibling's module named by a path: `super::serve::setup`, `use super::eval;`,
    # `crate::commands::serve::for_session`, or inside a `{...}` group.
    named = re.compile(
        rf"\b(?:super::(?:super::)*|crate::commands::)(?:\{{[^}}]*?\b)?({alt})\b(?=\s*(?:::|[;,}}]|as\b))"
    )
    offences = []
    for dirpath, _, files in os.walk(base):
        for f in sorted(files):
            path = os.path.join(dirpath, f)
            rel = os.path.relpath(path, base)
            if not f.endswith(".rs") or rel == "mod.rs":
                continue
            own = rel.split(os.sep)[0].removesuffix(".rs")
            with open(path, encoding="utf-8") as src:
                text = COMMENT.sub("", src.read())
            for m in named.finditer(text):
                if m.group(1) == own:
                    continue
                line = text.count("\n", 0, m.start()) + 1
                where = os.path.join(COMMANDS, rel)
                offences.append(
                    f"{where}:{line}: `{m.group(0).strip()}` reaches into the `{m.group(1)}` command: "
                    "move what both need into the library (or commands/mod.rs)"
                )
    for o in offences:
        print(o)
    print(f"{len(offences)} references from one command to another")
    return 1 if offences else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Writes the generated parts of the references from the binaries, so that they cannot drift:

- docs/CONFIGURATION.md: the flag table, `trainerd --flags_reference` (the flags' own help
  strings and defaults, server/main.cc);
- docs/CLI.md: `trainctl help` (the synopsis) and `trainctl help COMMAND` for every command it
  lists (trainctl's command table, client/command_table.cc).

Each part sits between `<!-- generated: WHAT -->` and `<!-- end generated -->`; the text around it
is written by hand.

    docs/generate.py --trainerd BIN --trainctl BIN [--check]

`make docs` writes them; with --check (the docs_generated test) it changes nothing and exits 1
with a diff when a file is not what the binaries print.
"""

from __future__ import annotations

import argparse
import difflib
import re
import subprocess
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
END = "<!-- end generated -->"


def run(*argv: str) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False,
                          stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        sys.exit(f"generate.py: {' '.join(argv)} exited {done.returncode}: {done.stderr.strip()}")
    return done.stdout.rstrip("\n")


def commands(trainctl: str) -> list[str]:
    """The commands `trainctl help` lists: the leading lower-case words of each line of its
    "Commands:" block ("dataset upload", "submit", "completion")."""
    names: list[str] = []
    listing = False
    for line in run(trainctl, "help").splitlines():
        if line.startswith("Commands:"):
            listing = True
            continue
        if listing and not line.strip():
            break
        if listing and line.startswith("  ") and not line.startswith("   "):
            words = []
            for word in line.split():
                if not re.fullmatch(r"[a-z][a-z-]*", word):
                    break
                words.append(word)
            if words and " ".join(words) not in names:
                names.append(" ".join(words))
    return names


def fill(text: str, what: str, body: str, path: Path) -> str:
    begin = f"<!-- generated: {what} -->"
    start = text.find(begin)
    end = text.find(END, start)
    if start < 0 or end < 0:
        sys.exit(f"generate.py: {path} has no '{begin}' ... '{END}' section")
    return text[: start + len(begin)] + "\n" + body + "\n" + text[end:]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trainerd", required=True)
    parser.add_argument("--trainctl", required=True)
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()

    flags = run(args.trainerd, "--flags_reference")
    synopsis = "```\n" + run(args.trainctl, "help") + "\n```"
    per_command = []
    for name in commands(args.trainctl):
        help_text = run(args.trainctl, "help", *name.split())
        per_command.append(f"### trainctl {name}\n\n```\n{help_text}\n```")
    per_command.append("### Exit codes\n\n```\n" + run(args.trainctl, "help", "exit-codes") + "\n```")

    wanted = {
        DOCS / "CONFIGURATION.md": [("trainerd --flags_reference", flags)],
        DOCS / "CLI.md": [("trainctl help", synopsis),
                          ("trainctl help COMMAND", "\n\n".join(per_command))],
    }
    stale = False
    for path, parts in wanted.items():
        text = path.read_text()
        new = text
        for what, body in parts:
            new = fill(new, what, body, path)
        if new == text:
            continue
        if args.check:
            stale = True
            sys.stdout.writelines(difflib.unified_diff(
                text.splitlines(keepends=True), new.splitlines(keepends=True),
                str(path), f"{path} (from the binaries)", n=1))
        else:
            path.write_text(new)
            print(f"generate.py: wrote {path.relative_to(DOCS.parent)}")
    if stale:
        print("generate.py: the generated parts above are out of date: run `make docs`",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

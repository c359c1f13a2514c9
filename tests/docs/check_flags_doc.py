#!/usr/bin/env python3
"""docs/flags.md holds the binary's own help text, verbatim, between marker lines
`<!-- help: CMD -->` and `<!-- end help -->` (CMD: main, train, eval, download). This check runs
`dptrain [CMD] --help` and fails, naming the command and the first line that differs, when the
document no longer says what the binary does.

    python3 tests/docs/check_flags_doc.py DPTRAIN docs/flags.md           # check
    python3 tests/docs/check_flags_doc.py --write DPTRAIN docs/flags.md   # regenerate the blocks
"""
import re
import subprocess
import sys

COMMANDS = ["main", "train", "eval", "download"]
BLOCK = re.compile(r"<!-- help: (\w+) -->\n```\n(.*?)```\n<!-- end help -->", re.S)


def help_text(binary, command):
    args = [binary, "--help"] if command == "main" else [binary, command, "--help"]
    run = subprocess.run(args, capture_output=True, text=True, timeout=60)
    if run.returncode != 0:
        sys.exit(f"check_flags_doc: {' '.join(args)} exited {run.returncode}: {run.stderr.strip()}")
    return run.stdout if run.stdout.endswith("\n") else run.stdout + "\n"


def main(argv):
    write = argv[1:2] == ["--write"]
    if write:
        argv = argv[1:]
    if len(argv) != 3:
        sys.exit(__doc__)
    binary, doc = argv[1], argv[2]
    with open(doc, encoding="utf-8") as f:
        text = f.read()
    found = {m.group(1): m for m in BLOCK.finditer(text)}
    fix = f"regenerate with: python3 tests/docs/check_flags_doc.py --write {binary} {doc}"
    for command in COMMANDS:
        if command not in found:
            print(f"check_flags_doc: {doc} has no block <!-- help: {command} --> ... "
                  f"<!-- end help -->; {fix}")
            return 1
        actual = help_text(binary, command)
        if write:
            text = text.replace(found[command].group(0), f"<!-- help: {command} -->\n```\n{actual}"
                                f"```\n<!-- end help -->")
            continue
        written = found[command].group(2)
        if written != actual:
            w, a = written.splitlines(), actual.splitlines()
            line = next((i for i in range(max(len(w), len(a)))
                         if i >= len(w) or i >= len(a) or w[i] != a[i]), 0)
            print(f"check_flags_doc: {doc}, the help of '{command}', line {line + 1}: the document "
                  f"says {w[line] if line < len(w) else '(nothing)'!r}, the binary "
                  f"{a[line] if line < len(a) else '(nothing)'!r}; {fix}")
            return 1
    if write:
        with open(doc, "w", encoding="utf-8") as f:
            f.write(text)
        print(f"check_flags_doc: wrote the help of {', '.join(COMMANDS)} into {doc}")
    else:
        print(f"check_flags_doc: {doc} says what '{binary} --help' says")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

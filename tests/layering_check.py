#!/usr/bin/env python3
"""Keeps the layers real: every `#include "dptrain/<layer>/..."` in lib/, app/, tests/, fuzz/ and
bench/ must point at the file's own layer or one below it, in the order of LAYERS; every header of
lib/include/dptrain/<layer>/ must have tests/<layer>/test_<name>.cpp or a line in
tests/CMakeLists.txt naming what covers it; and no source may sit outside a layer folder.

    python3 tests/layering_check.py [ROOT]       # the check; exit 1 naming each bad edge
    python3 tests/layering_check.py --self-test  # plants an upward include in a copy, which must fail

When it fails, move the code to where it belongs; do not add an exception here.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

# Bottom to top. A file may include its own layer and the layers before it.
LAYERS = ["core", "data", "parallel", "model", "train", "report", "app"]
INCLUDE = re.compile(r'^\s*#\s*include\s+"dptrain/([a-z_]+)/([^"]+)"', re.M)
SOURCE_SUFFIXES = (".h", ".cpp", ".cu")


def layer_of(root, path):
    """The layer a file belongs to, or None for files that sit above every layer (tests of the
    app, the integration tests, fuzzers, benchmarks may include any layer)."""
    rel = os.path.relpath(path, root).split(os.sep)
    if rel[:3] == ["lib", "include", "dptrain"] and len(rel) == 5:
        return rel[3]
    if rel[:2] == ["lib", "src"] and len(rel) == 4:
        return rel[2]
    if rel[0] == "app":
        return "app"
    if rel[0] == "tests" and len(rel) == 3 and rel[1] in LAYERS:
        return rel[1]  # a layer's tests include that layer and those below
    return None


def sources(root, top):
    for directory, _, names in os.walk(os.path.join(root, top)):
        for name in sorted(names):
            if name.endswith(SOURCE_SUFFIXES):
                yield os.path.join(directory, name)


def check(root):
    problems = []
    # Sources outside a layer folder.
    for top in ("lib/include/dptrain", "lib/src"):
        for path in sources(root, top):
            if layer_of(root, path) not in LAYERS:
                problems.append(f"{os.path.relpath(path, root)}: not inside a layer folder "
                                f"({', '.join(LAYERS[:-1])})")
    # Include edges.
    for top in ("lib", "app", "tests", "fuzz", "bench"):
        for path in sources(root, top):
            mine = layer_of(root, path)
            with open(path, encoding="utf-8", errors="replace") as f:
                text = f.read()
            for match in INCLUDE.finditer(text):
                target, name = match.group(1), match.group(2)
                line = text.count("\n", 0, match.start()) + 1
                where = f"{os.path.relpath(path, root)}:{line}"
                if target not in LAYERS:
                    problems.append(f'{where}: includes "dptrain/{target}/{name}", '
                                    f"which is in no layer")
                    continue
                if not os.path.exists(os.path.join(root, "lib", "include", "dptrain", target,
                                                   name)):
                    problems.append(f'{where}: includes "dptrain/{target}/{name}", '
                                    f"which does not exist")
                if mine is None:
                    continue
                if LAYERS.index(target) > LAYERS.index(mine):
                    problems.append(f'{where}: the {mine} layer includes "dptrain/{target}/'
                                    f'{name}", a layer above it (order: {" <- ".join(LAYERS)})')
    # A test file per header, or a line in tests/CMakeLists.txt naming what covers it.
    with open(os.path.join(root, "tests", "CMakeLists.txt"), encoding="utf-8") as f:
        test_list = f.read()
    for path in sources(root, "lib/include/dptrain"):
        layer = layer_of(root, path)
        name = os.path.splitext(os.path.basename(path))[0]
        own = os.path.join(root, "tests", layer, f"test_{name}.cpp")
        named = re.search(rf"^#\s+{layer}/{name}\.h\s+\S", test_list, re.M)
        if not os.path.exists(own) and not named:
            problems.append(f"lib/include/dptrain/{layer}/{name}.h: no tests/{layer}/test_{name}"
                            f".cpp and no line '#   {layer}/{name}.h  covered by ...' in "
                            f"tests/CMakeLists.txt")
    return problems


def self_test(root):
    """A copy of the tree with one upward include planted must fail, naming it."""
    with tempfile.TemporaryDirectory() as scratch:
        copy = os.path.join(scratch, "tree")
        for top in ("lib", "app", "tests", "fuzz", "bench"):
            shutil.copytree(os.path.join(root, top), os.path.join(copy, top),
                            ignore=shutil.ignore_patterns("*.bin", "results", "corpus"))
        planted = os.path.join(copy, "lib", "src", "core", "files.cpp")
        with open(planted, "a", encoding="utf-8") as f:
            f.write('#include "dptrain/train/train.h"\n')
        run = subprocess.run([sys.executable, os.path.abspath(__file__), copy],
                             capture_output=True, text=True)
        expected = 'lib/src/core/files.cpp'
        if run.returncode == 0 or expected not in run.stdout or "a layer above it" not in run.stdout:
            print("layering self-test: a planted core -> train include was not caught:\n"
                  + run.stdout + run.stderr)
            return 1
        clean = subprocess.run([sys.executable, os.path.abspath(__file__), root],
                               capture_output=True, text=True)
        if clean.returncode != 0:
            print(clean.stdout + clean.stderr, end="")
            return 1
        print("layering self-test: the planted include fails the check:\n  "
              + run.stdout.strip().splitlines()[0])
    return 0


def main(argv):
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if argv[1:2] == ["--self-test"]:
        return self_test(here)
    root = os.path.abspath(argv[1]) if len(argv) > 1 else here
    problems = check(root)
    for problem in problems:
        print(problem)
    if problems:
        print(f"layering: {len(problems)} problem(s); move the code to where it belongs")
        return 1
    print(f"layering: every include points down ({' <- '.join(LAYERS)})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

#!/usr/bin/env python3
"""Keeps the layers real: every `#include "dptrain/<layer>/..."` in lib/, app/, tests/, fuzz/ and
bench/ must point at the file's own layer or one below it, in the order of LAYERS; every header of
lib/include/dptrain/<layer>/ must have tests/<layer>/test_<name>.cpp or a line in
tests/CMakeLists.txt naming what covers it; no source may sit outside a layer folder; and inside
lib/ no file of a layer includes that layer's top header (TOP_HEADERS) but the header's own source.

    python3 tests/layering_check.py [ROOT]       # the check; exit 1 naming each bad edge
    python3 tests/layering_check.py --self-test  # plants an upward include and an include of a
                                                 # layer's top header in copies, which must fail

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
# The header a layer offers the layers above as its entry point. Inside the layer only its own
# source includes it: what the layer's other files share (options, callbacks, figures, the model's
# parts) has a header of its own lower down, so that the layer's files do not point up at its top.
TOP_HEADERS = {"model": "model.h", "train": "train.h", "report": "report.h"}


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
                rel = os.path.relpath(path, root).split(os.sep)
                own_source = os.path.splitext(rel[-1])[0] == os.path.splitext(name)[0]
                if (rel[0] == "lib" and target == mine and TOP_HEADERS.get(mine) == name
                        and not own_source):
                    problems.append(f'{where}: includes "dptrain/{target}/{name}", its layer\'s '
                                    f"top header; include the header of what it uses instead")
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
    """Copies of the tree with one bad include planted must fail, naming it: an upward include,
    and an include of a layer's top header from inside the layer."""
    plants = [
        ("lib/src/core/files.cpp", '#include "dptrain/train/train.h"\n', "a layer above it"),
        ("lib/src/train/finite.cpp", '#include "dptrain/train/train.h"\n', "top header"),
    ]
    first_lines = []
    for planted_file, line, expected in plants:
        with tempfile.TemporaryDirectory() as scratch:
            copy = os.path.join(scratch, "tree")
            for top in ("lib", "app", "tests", "fuzz", "bench"):
                shutil.copytree(os.path.join(root, top), os.path.join(copy, top),
                                ignore=shutil.ignore_patterns("*.bin", "results", "corpus"))
            with open(os.path.join(copy, planted_file), "a", encoding="utf-8") as f:
                f.write(line)
            run = subprocess.run([sys.executable, os.path.abspath(__file__), copy],
                                 capture_output=True, text=True)
            if run.returncode == 0 or planted_file not in run.stdout or expected not in run.stdout:
                print(f"layering self-test: a planted include in {planted_file} was not caught:\n"
                      + run.stdout + run.stderr)
                return 1
            first_lines.append(next(l for l in run.stdout.splitlines() if planted_file in l))
    clean = subprocess.run([sys.executable, os.path.abspath(__file__), root],
                           capture_output=True, text=True)
    if clean.returncode != 0:
        print(clean.stdout + clean.stderr, end="")
        return 1
    print("layering self-test: the planted includes fail the check:\n  " + "\n  ".join(first_lines))
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

"""The self-test every checker of the tree runs (tests/layering_check.py, tests/include_check.py,
tests/docs/check_architecture.py, tests/docs/check_hardening.py): plant each defect in a copy of
the tree, run the checker on the copy, and require that it fails naming the defect; then require
that the real tree passes.
Not here: what a checker looks for, and how a defect is planted (each checker passes its own).
"""
import os
import shutil
import subprocess
import sys
import tempfile

# What a copy leaves out: large test data that no checker reads.
IGNORED = shutil.ignore_patterns("*.bin", "results", "corpus", "fixtures", "build*", ".venv*")


def copy_tree(root, tops, destination):
    """Copies the folders (or files) `tops` of `root` into `destination`."""
    for top in tops:
        source = os.path.join(root, top)
        if os.path.isdir(source):
            shutil.copytree(source, os.path.join(destination, top), ignore=IGNORED)
        elif os.path.exists(source):
            os.makedirs(os.path.dirname(os.path.join(destination, top)), exist_ok=True)
            shutil.copy(source, os.path.join(destination, top))


def append_line(path, line):
    """A plant: `line` added at the end of the file at `path`."""
    with open(path, "a", encoding="utf-8") as f:
        f.write(line)


def replace_once(path, old, new):
    """A plant: the first `old` in the file at `path` replaced by `new` (which must be there)."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if old not in text:
        raise ValueError(f"{path}: no {old!r} to plant a defect at")
    with open(path, "w", encoding="utf-8") as f:
        f.write(text.replace(old, new, 1))


def run_self_test(name, checker, root, tops, plants, extra_args=()):
    """Runs `checker` (a script path) on a copy of `tops` of `root` for each plant, a tuple
    (plant, expected): plant(copy_root) edits the copy, and the checker must exit non-zero with
    every string of `expected` in one line of its output. Then it must pass on `root` itself.
    Prints the line each plant produced; returns the exit code of the self-test."""
    caught = []
    for plant, expected in plants:
        with tempfile.TemporaryDirectory() as scratch:
            copy = os.path.join(scratch, "tree")
            os.makedirs(copy)
            copy_tree(root, tops, copy)
            plant(copy)
            run = subprocess.run([sys.executable, checker, *extra_args, copy],
                                 capture_output=True, text=True)
            line = next((l for l in run.stdout.splitlines()
                         if all(e in l for e in expected)), None)
            if run.returncode == 0 or line is None:
                print(f"{name} self-test: a planted defect ({', '.join(expected)}) was not "
                      f"caught:\n{run.stdout}{run.stderr}")
                return 1
            caught.append(line.replace(copy + os.sep, ""))
    clean = subprocess.run([sys.executable, checker, *extra_args, root],
                           capture_output=True, text=True)
    if clean.returncode != 0:
        print(clean.stdout + clean.stderr, end="")
        return 1
    print(f"{name} self-test: the planted defects fail the check:\n  " + "\n  ".join(caught))
    return 0

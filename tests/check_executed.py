#!/usr/bin/env python3
"""Fails when a test that should have run did not, or when one ran that no list names.

A test compiled out (#if on a library the build did not find), never registered (a CTest entry
behind an if() in tests/CMakeLists.txt) or filtered away leaves no result at all: neither CTest
nor tests/check_skips.py can see it. So scripts/test.sh and scripts/sanitize.sh hold the names
of the tests this run executed (skipped ones included: check_skips.py judges those) against the
committed list of the build's flavour under tests/expected_tests/: one that is listed but did not
run fails the check, naming it, and so does one that ran but is not listed, until it is added.
It does not check the tests' own results: CTest did that.

  check_executed.py --build-dir build [--results build/Testing/gtest]
                    [--ctest-junit build/Testing/ctest-junit.xml]
  check_executed.py --build-dir build --write       (the list of this run, to commit)
  check_executed.py --self-test

The flavour comes from what CMake wrote into the build (dptrain_test_flavour.txt, see
tests/CMakeLists.txt): a sanitizer build runs the quick tests (sanitizers.txt), a LibTorch 1.x
build Debian's 1.13 list, a 2.x one PyPI's. A list line is a test's name, or a name and the
condition under which the build has it: `| cuda-build`, a test compiled only where LibTorch
has CUDA (it skips without a GPU, which tests/expected_skips.txt allows).
"""
import argparse
import os
import re
import sys
import tempfile
import xml.etree.ElementTree as ElementTree

LISTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "expected_tests")
FLAVOUR_FILE = "dptrain_test_flavour.txt"
CONDITIONS = ("cuda-build",)
# CTest entries that are GoogleTest shards: their tests are named in the shards' XML instead.
SHARD_ENTRY = re.compile(r"^[a-z]+\.(quick|slow)\.\d+of\d+$")


# ---- What ran ---------------------------------------------------------------------------------

def gtest_names(results_dir):
    """The Suite.Name of every test case the GoogleTest-shaped XML files under results_dir report
    as run (a parameterised integration test's file lies in a folder named by its '/')."""
    names = set()
    for folder, _, files in os.walk(results_dir):
        for name in files:
            if not name.endswith(".xml"):
                continue
            path = os.path.join(folder, name)
            try:
                root = ElementTree.parse(path).getroot()
            except (ElementTree.ParseError, OSError) as error:
                raise SystemExit(f"error: {path}: unreadable test results ({error})")
            for case in root.iter("testcase"):
                # GoogleTest reports a DISABLED_ test as status="notrun": it did not run.
                if case.get("status", "run") == "run":
                    names.add(f"{case.get('classname')}.{case.get('name')}")
    return names


def ctest_names(junit):
    """The names of CTest's entries other than the GoogleTest shards, with the integration
    binary's prefix and GoogleTest's "  # GetParam() = ..." taken off (its GoogleTest name)."""
    try:
        root = ElementTree.parse(junit).getroot()
    except (ElementTree.ParseError, OSError) as error:
        raise SystemExit(f"error: {junit}: unreadable CTest results ({error})")
    names = set()
    for case in root.iter("testcase"):
        name = case.get("name", "").split("  # ", 1)[0]
        if SHARD_ENTRY.match(name):
            continue
        names.add(name[len("integration."):] if name.startswith("integration.") else name)
    return names


def executed(results_dir, junit):
    if not os.path.isdir(results_dir):
        raise SystemExit(f"error: {results_dir}: no test results (did the tests run?)")
    return gtest_names(results_dir) | (ctest_names(junit) if junit else set())


# ---- What should have run ---------------------------------------------------------------------

def build_flavour(build_dir):
    """{key: value} of the flavour file CMake wrote into the build directory."""
    path = os.path.join(build_dir, FLAVOUR_FILE)
    try:
        with open(path, encoding="utf-8") as facts:
            return dict(line.strip().split("=", 1) for line in facts if "=" in line)
    except OSError as error:
        raise SystemExit(f"error: {path}: cannot read the build's flavour ({error.strerror}); "
                         f"configure the build again")


def list_for(flavour):
    """The list's file name for a build's flavour."""
    if flavour.get("sanitizer_build") == "ON":
        return "sanitizers.txt"
    if flavour.get("libtorch", "").startswith("1."):
        return "debian-libtorch-1.13.txt"
    return "pypi-libtorch-2.x.txt"


def read_list(path):
    """{name: condition or None}; a malformed line is an error."""
    listed = {}
    with open(path, encoding="utf-8") as listing:
        for number, line in enumerate(listing, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            name, _, condition = (part.strip() for part in line.partition("|"))
            if not name or (condition and condition not in CONDITIONS):
                raise SystemExit(f"error: {path}:{number}: want '<Suite.Name>' or '<Suite.Name> | "
                                 f"<condition>' ({', '.join(CONDITIONS)}), got: {line}")
            listed[name] = condition or None
    return listed


def check(ran, listed, facts, list_name):
    """The lines to print: a listed test that the build should have and did not run, and a test
    that ran and is not listed (empty: the run is the list)."""
    problems = []
    for name in sorted(listed):
        condition = listed[name]
        if name not in ran and (condition is None or facts.get(condition)):
            problems.append(f"missing: {name} is in tests/expected_tests/{list_name} but did not "
                            f"run (compiled out, not registered, or filtered away?)")
    for name in sorted(ran - set(listed)):
        problems.append(f"new: {name} ran but is not in tests/expected_tests/{list_name}: add it "
                        f"(check_executed.py --write prints this run's list)")
    return problems


def facts_of(flavour):
    return {"cuda-build": flavour.get("cuda_build") == "ON"}


# ---- The command ------------------------------------------------------------------------------

def run(args):
    flavour = build_flavour(args.build_dir)
    results = args.results or os.path.join(args.build_dir, "Testing", "gtest")
    junit = args.ctest_junit or os.path.join(args.build_dir, "Testing", "ctest-junit.xml")
    ran = executed(results, junit if os.path.exists(junit) else None)
    list_name = list_for(flavour)
    if args.write:
        for name in sorted(ran):
            print(name)
        return 0
    problems = check(ran, read_list(os.path.join(LISTS, list_name)), facts_of(flavour),
                     list_name)
    for line in problems:
        print(f"check_executed: {line}", file=sys.stderr)
    described = ", ".join(f"{k} {v}" for k, v in sorted(flavour.items()))
    if problems:
        print(f"error: {len(problems)} tests differ between this run ({len(ran)} tests; "
              f"{described}) and tests/expected_tests/{list_name}", file=sys.stderr)
        return 1
    print(f"check_executed: the {len(ran)} tests of tests/expected_tests/{list_name} ran, and "
          f"no other ({described})")
    return 0


def self_test():
    """Every committed list against results written the way GoogleTest and CTest write them: the
    whole list passes, the list with one test planted missing fails naming it, and so does one
    planted test the list does not name."""
    failures = []
    for list_name in sorted(os.listdir(LISTS)):
        listed = read_list(os.path.join(LISTS, list_name))
        everything = set(listed)
        facts = {condition: True for condition in CONDITIONS}
        with tempfile.TemporaryDirectory() as work:
            def ran_of(names):
                cases = "".join(
                    '<testcase name="{1}" status="run" result="completed" classname="{0}"/>'
                    .format(*name.split(".", 1)) for name in sorted(names))
                for old in os.listdir(work):
                    os.remove(os.path.join(work, old))
                with open(os.path.join(work, "shard.xml"), "w", encoding="utf-8") as out:
                    out.write(f"<testsuites><testsuite>{cases}</testsuite></testsuites>")
                return executed(work, None)
            if check(ran_of(everything), listed, facts, list_name):
                failures.append(f"{list_name}: a run of the whole list failed the check")
            gone = sorted(everything)[len(everything) // 2]
            missing = check(ran_of(everything - {gone}), listed, facts, list_name)
            if not any(line.startswith(f"missing: {gone} ") for line in missing):
                failures.append(f"{list_name}: a run without {gone} passed the check")
            new = check(ran_of(everything | {"Planted.NewTest"}), listed, facts, list_name)
            if not any(line.startswith("new: Planted.NewTest ") for line in new):
                failures.append(f"{list_name}: a run with an unlisted test passed the check")
            # A build without CUDA lacks the tests compiled only with it, and that is no fault.
            cuda_only = {name for name, condition in listed.items() if condition == "cuda-build"}
            if cuda_only and check(ran_of(everything - cuda_only), listed,
                                   {"cuda-build": False}, list_name):
                failures.append(f"{list_name}: a build without CUDA failed for lacking the "
                                f"tests only a CUDA build has")
            print(f"check_executed self-test: {list_name}: {len(everything)} tests pass; "
                  f"without {gone}: {missing[0] if missing else 'PASSED'}")
    for failure in failures:
        print(f"check_executed self-test: {failure}", file=sys.stderr)
    return 1 if failures else 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build-dir", help="the build under test")
    parser.add_argument("--results", help="its GoogleTest XML (default: <build>/Testing/gtest)")
    parser.add_argument("--ctest-junit",
                        help="CTest's --output-junit file (default: <build>/Testing/ctest-junit.xml)")
    parser.add_argument("--write", action="store_true", help="print the names this run executed")
    parser.add_argument("--self-test", action="store_true")
    args = parser.parse_args()
    if args.self_test:
        return self_test()
    if not args.build_dir:
        parser.error("--build-dir is needed")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Keeps the sanitizer binary honest (CTest Sanitize.QuickTestsLiveInTheQuickTestSources).

scripts/sanitize.sh builds dptrain_quick_tests from a subset of the test files and runs the
patterns of tests/sanitizers/quick_tests.txt in it. A quick test moved to a file outside that
subset would silently drop out of the sanitizer run, so this reads the full test binary's list
and fails when a test the patterns select lives in a file outside the subset, when a file of the
subset holds none of them, or when a pattern selects nothing (a renamed test). It also checks
that its own matching selects what GoogleTest's --gtest_filter selects.

usage: check_quick_tests.py --binary dptrain_tests --patterns quick_tests.txt
                            --tests-dir tests/ [--allow-empty PATTERN]... SOURCE...
SOURCE: the quick test files, relative to --tests-dir.
"""
import argparse
import fnmatch
import json
import os
import subprocess
import sys
import tempfile


def read_patterns(path):
    """The file's positive and negative patterns, each with its line number."""
    positive, negative = [], []
    with open(path, encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            if ":" in line:
                raise ValueError(f"{path}:{number}: one pattern per line, no ':'")
            if line.startswith("-"):
                negative.append((line[1:], number))
            else:
                positive.append((line, number))
    return positive, negative


def gtest_filter(positive, negative):
    """The --gtest_filter that scripts/sanitize.sh builds from the same file."""
    text = ":".join(pattern for pattern, _ in positive)
    if negative:
        text += "-" + ":".join(pattern for pattern, _ in negative)
    return text


def list_tests(binary, extra_args):
    """{full test name: source file} of the tests the binary lists under extra_args."""
    with tempfile.TemporaryDirectory() as scratch:
        output = os.path.join(scratch, "tests.json")
        subprocess.run([binary, "--gtest_list_tests", f"--gtest_output=json:{output}", *extra_args],
                       check=True, stdout=subprocess.DEVNULL)
        with open(output, encoding="utf-8") as listing:
            suites = json.load(listing)["testsuites"]
    return {f"{suite['name']}.{test['name']}": test["file"]
            for suite in suites for test in suite["testsuite"]}


def matches(pattern, name):
    # GoogleTest's patterns know '*' and '?' only; fnmatch's '[' never occurs in a test name.
    return fnmatch.fnmatchcase(name, pattern)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--binary", required=True)
    parser.add_argument("--patterns", required=True)
    parser.add_argument("--tests-dir", required=True)
    parser.add_argument("--allow-empty", action="append", default=[],
                        help="a pattern whose tests this build leaves out")
    parser.add_argument("sources", nargs="+")
    args = parser.parse_args()

    positive, negative = read_patterns(args.patterns)
    every_test = list_tests(args.binary, [])
    selected = {name: source for name, source in every_test.items()
                if any(matches(p, name) for p, _ in positive)
                and not any(matches(p, name) for p, _ in negative)}
    by_gtest = list_tests(args.binary, [f"--gtest_filter={gtest_filter(positive, negative)}"])

    errors = []
    if set(selected) != set(by_gtest):
        differ = sorted(set(selected) ^ set(by_gtest))
        errors.append(f"this check and --gtest_filter select different tests: {differ[:5]}")
    for pattern, number in positive + negative:
        if pattern in args.allow_empty:
            continue
        if not any(matches(pattern, name) for name in every_test):
            errors.append(f"{args.patterns}:{number}: '{pattern}' matches no test")

    tests_dir = os.path.realpath(args.tests_dir)
    quick_sources = {os.path.realpath(os.path.join(tests_dir, s)) for s in args.sources}
    for name, source in sorted(selected.items()):
        if os.path.realpath(source) not in quick_sources:
            relative = os.path.relpath(source, tests_dir)
            errors.append(f"{name} is a quick test but {relative} is not among "
                          "dptrain_quick_test_sources (tests/CMakeLists.txt)")
    holding = {os.path.realpath(source) for source in selected.values()}
    for source in sorted(quick_sources - holding):
        relative = os.path.relpath(source, tests_dir)
        errors.append(f"{relative} holds no quick test; take it out of "
                      "dptrain_quick_test_sources (tests/CMakeLists.txt)")

    for error in errors:
        print(f"error: {error}", file=sys.stderr)
    if errors:
        return 1
    print(f"{len(selected)} quick tests in {len(quick_sources)} files, "
          f"of {len(every_test)} tests")
    return 0


if __name__ == "__main__":
    sys.exit(main())

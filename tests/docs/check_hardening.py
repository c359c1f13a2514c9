#!/usr/bin/env python3
"""Holds docs/hardening.md's fault tables to the tests: every row's last column names the tests
that hold the fault (or says "—"), and every name there must be a test of tests/: a GoogleTest
case (`Suite.Name`, `Suite.*`, `Prefix/Suite.Name/param`, `Suite.Name/*`), a Python test
(`Class.test_name`) or a CTest entry (`Suite.Name` given to add_test or dptrain_add_venv_test).
A test renamed or removed fails here until the document follows.

    python3 tests/docs/check_hardening.py [ROOT]       # the check; exit 1 naming each miss
    python3 tests/docs/check_hardening.py --self-test  # plants a name that is no test
"""
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import self_test as self_test_support  # noqa: E402

FAULTS = re.compile(r"^## Faults\b.*?$(.*?)(?=^## |\Z)", re.M | re.S)
CELL = re.compile(r"(?<!\\)\|")
NAME = re.compile(r"^(?:(\w+)/)?([A-Z]\w*)\.(\w+|\*)(?:/([\w*]+))?$")
GTEST = re.compile(r"\b(?:TEST|TEST_F|TEST_P|TYPED_TEST)\(\s*(\w+)\s*,\s*(\w+)\s*\)")
INSTANCE = re.compile(r"INSTANTIATE_TEST_SUITE_P\(\s*(\w*)\s*,\s*(\w+)")
CTEST = re.compile(r"(?:add_test\(NAME|dptrain_add_venv_test\()\s*([\w.]+)")
PY_CLASS = re.compile(r"^class (\w+)")
PY_TEST = re.compile(r"^\s+def (test_\w+)")


def known_tests(root):
    """(names, suites, instances, text): every test name, suite, `Prefix/Suite`, and all test
    sources joined (for parameter names, which are string literals)."""
    names, suites, instances, text = set(), set(), set(), []
    for folder, _, files in os.walk(os.path.join(root, "tests")):
        for file in files:
            path = os.path.join(folder, file)
            if not file.endswith((".cpp", ".h", ".py", ".txt")):
                continue
            with open(path, encoding="utf-8", errors="replace") as f:
                source = f.read()
            text.append(source)
            if file.endswith((".cpp", ".h")):
                for suite, name in GTEST.findall(source):
                    names.add(f"{suite}.{name}")
                    suites.add(suite)
                for prefix, suite in INSTANCE.findall(source):
                    instances.add(f"{prefix}/{suite}")
            elif file.endswith(".py"):
                current = None
                for line in source.splitlines():
                    if PY_CLASS.match(line):
                        current = PY_CLASS.match(line).group(1)
                    elif PY_TEST.match(line) and current:
                        names.add(f"{current}.{PY_TEST.match(line).group(1)}")
                        suites.add(current)
            elif file == "CMakeLists.txt":
                for name in CTEST.findall(source):
                    names.add(name)
                    suites.add(name.split(".")[0])
    return names, suites, instances, "\n".join(text)


def miss(token, known):
    """Why `token` names no test, or None when it does."""
    names, suites, instances, text = known
    match = NAME.match(token)
    if not match:
        return "is not a test name"
    prefix, suite, name, param = match.groups()
    if prefix is not None and f"{prefix}/{suite}" not in instances:
        return f"no INSTANTIATE_TEST_SUITE_P({prefix}, {suite}, ...)"
    if name == "*":
        return None if suite in suites else f"no test suite {suite}"
    if f"{suite}.{name}" not in names:
        return "no such test"
    if param not in (None, "*") and f'"{param}"' not in text:
        return f"no parameter \"{param}\""
    return None


def check(root):
    with open(os.path.join(root, "docs", "hardening.md"), encoding="utf-8") as f:
        doc = f.read()
    section = FAULTS.search(doc)
    if not section:
        return ["docs/hardening.md: no section '## Faults ...'"]
    known = known_tests(root)
    problems, cited = [], 0
    for line in section.group(1).splitlines():
        cells = [cell.strip() for cell in CELL.split(line)]
        if len(cells) < 4 or not line.startswith("|") or set(cells[1]) <= set("-"):
            continue
        fault, tests = cells[1], cells[-2]
        if tests == "test":
            continue  # the header
        tokens = [t for t in re.findall(r"`([^`]+)`", tests) if re.match(r"^[A-Z]\w*[./]", t)]
        if not tokens and not tests.startswith("—"):
            problems.append(f"docs/hardening.md: the row '{fault[:60]}' names no test")
        for token in tokens:
            cited += 1
            why = miss(token, known)
            if why:
                problems.append(f"docs/hardening.md: `{token}` ({fault[:50]}): {why} in tests/")
    if not cited:
        problems.append("docs/hardening.md: the fault tables name no test")
    return problems


def self_test(root):
    """A copy of the document that cites a test tests/ does not have must fail the check."""
    plant = lambda copy: self_test_support.replace_once(  # noqa: E731
        os.path.join(copy, "docs", "hardening.md"),
        "`MultiProcess.KilledRankMakesTheOtherFailWithinTheTimeout`",
        "`MultiProcess.APlantedTestThatDoesNotExist`")
    return self_test_support.run_self_test("hardening", os.path.abspath(__file__), root,
                                           ("tests", "docs/hardening.md"),
                                           [(plant, ["APlantedTestThatDoesNotExist"])])


def main(argv):
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if argv[1:2] == ["--self-test"]:
        return self_test(here)
    root = os.path.abspath(argv[1]) if len(argv) > 1 else here
    problems = check(root)
    for problem in problems:
        print(problem)
    if problems:
        return 1
    print("hardening: every test the fault tables name is a test of tests/")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

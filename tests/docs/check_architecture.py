#!/usr/bin/env python3
"""Holds docs/architecture.md's "One step" list to the code: every item names `FILE: FUNCTION`,
and FUNCTION (plain, or Class::method) must be defined in FILE; the heading's count of hops and
files ("Eleven hops through five files") must be the list's length and its number of files.

    python3 tests/docs/check_architecture.py [ROOT]      # the check; exit 1 naming each mismatch
    python3 tests/docs/check_architecture.py --self-test # plants a wrong name and a wrong count
"""
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import self_test as self_test_support  # noqa: E402

NUMBERS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
           "eleven", "twelve", "thirteen", "fourteen", "fifteen"]
SECTION = re.compile(r"^## One step\b.*?$(.*?)(?=^## )", re.M | re.S)
COUNT = re.compile(r"^(\w+) hops through (\w+) files", re.M | re.I)
ITEM = re.compile(r"^(\d+)\.\s+`([^`:]+):\s*([A-Za-z_][\w:]*)`", re.M)


def number(word):
    word = word.lower()
    return int(word) if word.isdigit() else NUMBERS.index(word) if word in NUMBERS else None


def defined(text, function):
    """Whether `function` has a definition in `text`: at the start of a line (a return type, or
    none), the name, its parameters, and a body, not a `;`."""
    name = re.escape(function)
    pattern = rf"^(?:[A-Za-z_][^\n;(){{}}=]*?[\s*&])?{name}\s*\([^;{{}}]*\)[^;{{}}]*\{{"
    return re.search(pattern, text, re.M) is not None


def check(root):
    path = os.path.join(root, "docs", "architecture.md")
    with open(path, encoding="utf-8") as f:
        doc = f.read()
    section = SECTION.search(doc)
    if not section:
        return ["docs/architecture.md: no section '## One step ...'"]
    body = section.group(1)
    problems = []
    items = ITEM.findall(body)
    if not items:
        problems.append("docs/architecture.md: the One step section lists no `FILE: FUNCTION`")
    for i, (index, file, function) in enumerate(items, start=1):
        if int(index) != i:
            problems.append(f"docs/architecture.md: item {index} of One step should be {i}")
        source = os.path.join(root, file)
        if not os.path.exists(source):
            problems.append(f"docs/architecture.md: One step {index}: {file} does not exist")
            continue
        with open(source, encoding="utf-8") as f:
            if not defined(f.read(), function):
                problems.append(f"docs/architecture.md: One step {index}: {file} defines no "
                                f"{function}")
    count = COUNT.search(body)
    files = len({file for _, file, _ in items})
    if not count:
        problems.append("docs/architecture.md: One step does not say 'N hops through M files'")
    else:
        hops, through = number(count.group(1)), number(count.group(2))
        if hops != len(items):
            problems.append(f"docs/architecture.md: One step says {count.group(1)} hops, its list "
                            f"has {len(items)}")
        if through != files:
            problems.append(f"docs/architecture.md: One step says {count.group(2)} files, its list "
                            f"names {files}")
    return problems


def self_test(root):
    """Copies of the tree with a function renamed in the list, and with a wrong count, must fail."""
    with open(os.path.join(root, "docs", "architecture.md"), encoding="utf-8") as f:
        body = SECTION.search(f.read()).group(1)
    first, count = ITEM.search(body), COUNT.search(body)

    def plant(old, new):
        return lambda copy: self_test_support.replace_once(
            os.path.join(copy, "docs", "architecture.md"), old, new)
    plants = [
        (plant(f"`{first.group(2)}: {first.group(3)}`",
               f"`{first.group(2)}: {first.group(3)}_renamed`"), ["defines no"]),
        (plant(count.group(0), f"Two hops through {count.group(2)} files"), ["hops"]),
    ]
    return self_test_support.run_self_test("architecture", os.path.abspath(__file__), root,
                                           ("app", "lib", "docs/architecture.md"), plants)


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
    print("architecture: every function of One step is defined where the list says")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

#!/usr/bin/env python3
"""Holds docs/architecture.md to the code. Its "One step" list: every item names `FILE: FUNCTION`,
and FUNCTION (plain, or Class::method) must be defined in FILE; the heading's count of hops and
files ("Eleven hops through five files") must be the list's length and its number of files. Its
Notes index ("Where each Note lives"): every Note the code defines is listed with its file, and
every Note listed is defined in that file.

    python3 tests/docs/check_architecture.py [ROOT]      # the check; exit 1 naming each mismatch
    python3 tests/docs/check_architecture.py --self-test # plants a wrong name, a wrong count,
                                                          # a Note left out, a Note that is not
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
NOTES = re.compile(r"^## Where each Note lives\b.*?$(.*?)(?=^## |\Z)", re.M | re.S)
NOTE_ROW = re.compile(r"^\|\s*([^|`]+?)\s*\|\s*`([^`]+)`\s*\|\s*$", re.M)
# A Note is defined where a comment line holds only `Note [TITLE]` and the next line goes on with
# its text; a comment that names a Note to point at it (`// Note [X] in y.cpp`, or alone above
# code) is a reference, not a definition.
NOTE_DEFINITION = re.compile(r"^[ \t]*(?://|#)[ \t]*Note \[([^\]\n]+)\][ \t]*\n[ \t]*(?://|#)[ \t]*\S",
                             re.M)
# Where Notes may be defined: the code, its tests, scripts and build files.
NOTE_SOURCES = ("lib", "app", "tests", "scripts", "fuzz", "bench", "docker", ".ci",
                "CMakeLists.txt")


def number(word):
    word = word.lower()
    return int(word) if word.isdigit() else NUMBERS.index(word) if word in NUMBERS else None


def defined(text, function):
    """Whether `function` has a definition in `text`: at the start of a line (a return type, or
    none), the name, its parameters, and a body, not a `;`."""
    name = re.escape(function)
    pattern = rf"^(?:[A-Za-z_][^\n;(){{}}=]*?[\s*&])?{name}\s*\([^;{{}}]*\)[^;{{}}]*\{{"
    return re.search(pattern, text, re.M) is not None


def defined_notes(root):
    """{title: [files defining it]} over NOTE_SOURCES, paths relative to root."""
    notes = {}
    for top in NOTE_SOURCES:
        start = os.path.join(root, top)
        walk = [(root, [], [top])] if os.path.isfile(start) else os.walk(start)
        for folder, _, files in walk:
            for name in files:
                path = os.path.join(folder, name)
                try:
                    with open(path, encoding="utf-8") as f:
                        text = f.read()
                except (UnicodeDecodeError, OSError):
                    continue
                for title in NOTE_DEFINITION.findall(text):
                    notes.setdefault(title, []).append(os.path.relpath(path, root))
    return notes


def check_notes(root, doc):
    """The Notes index lists every Note the code defines, each under the file that defines it."""
    section = NOTES.search(doc)
    if not section:
        return ["docs/architecture.md: no section '## Where each Note lives'"]
    listed = {}
    for titles, file in NOTE_ROW.findall(section.group(1)):
        for title in (t.strip() for t in titles.split(";")):
            if title and title != "Note":
                listed[title] = file
    defined = defined_notes(root)
    problems = []
    for title, files in sorted(defined.items()):
        if title not in listed:
            problems.append(f"docs/architecture.md: the Notes index does not list Note [{title}] "
                            f"({files[0]})")
        elif listed[title] not in files:
            problems.append(f"docs/architecture.md: the Notes index puts Note [{title}] in "
                            f"{listed[title]}, it is defined in {', '.join(files)}")
    for title, file in sorted(listed.items()):
        if title not in defined:
            problems.append(f"docs/architecture.md: the Notes index lists Note [{title}] ({file}), "
                            f"which no file defines")
    return problems


def check(root):
    path = os.path.join(root, "docs", "architecture.md")
    with open(path, encoding="utf-8") as f:
        doc = f.read()
    notes = check_notes(root, doc)
    section = SECTION.search(doc)
    if not section:
        return notes + ["docs/architecture.md: no section '## One step ...'"]
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
    return notes + problems


def self_test(root):
    """Copies of the tree with a function renamed in the list, a wrong count, a Note dropped from
    the index and a Note listed that no file defines must fail."""
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
        (plant("| No std::filesystem |", "| |"), ["does not list Note [No std::filesystem]"]),
        (plant("| No std::filesystem |", "| No std::filesystem; A planted Note |"),
         ["lists Note [A planted Note]"]),
    ]
    return self_test_support.run_self_test("architecture", os.path.abspath(__file__), root,
                                           (*NOTE_SOURCES, "docs/architecture.md"), plants)


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
    print("architecture: every function of One step is defined where the list says, and the "
          "Notes index lists every Note where it is defined")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

#!/usr/bin/env python3
"""Keeps includes honest: every `#include "dptrain/..."` in lib/, app/, tests/, fuzz/ and bench/
(and in lib/ and app/ every quoted include of a header beside the file, like "rank.h") must be
used: the including file names at least one thing that header declares (a class, struct, enum,
alias, function, constant or macro; a member reached through `.` or `->` does not count). A file
may always include its own header (x.cpp -> x.h).

    python3 tests/include_check.py [ROOT]       # the check; exit 1 naming each unused include
    python3 tests/include_check.py --self-test  # plants an unused include in a copy, which must fail

Include-what-you-use (Debian's `iwyu`) does this and more for the standard library too, but
with LibTorch's headers it takes minutes per file and reports mostly LibTorch's own layout; this
reads only our headers and runs in a second. When it fails, remove the include (or include the
header that declares what the file uses); do not add an exception here.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

TOPS = ("lib", "app", "tests", "fuzz", "bench")
SOURCE_SUFFIXES = (".h", ".cpp", ".cu")
QUOTED = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
IDENT = re.compile(r"[A-Za-z_]\w*")
KEYWORDS = set("""alignas alignof auto bool break case catch char class const constexpr
    const_cast continue decltype default delete do double dynamic_cast else enum explicit extern
    false float for friend goto if inline int long mutable namespace new noexcept nullptr operator
    private protected public register reinterpret_cast return short signed sizeof static
    static_assert static_cast struct switch template this throw true try typedef typeid typename
    union unsigned using virtual void volatile while int8_t int16_t int32_t int64_t uint8_t
    uint16_t uint32_t uint64_t size_t std override final""".split())


def strip_code(text):
    """The text without comments, string and character literals (newlines kept)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            out.append("\n" * text.count("\n", i, n if j < 0 else j))
            i = n if j < 0 else j + 2
        elif text.startswith('R"', i):  # a raw string: R"delim( ... )delim"
            m = re.match(r'R"([^(\s]*)\(', text[i:])
            end = text.find(")" + (m.group(1) if m else "") + '"', i)
            out.append('""' + "\n" * text.count("\n", i, n if end < 0 else end))
            i = n if end < 0 else end + len(m.group(1) if m else "") + 2
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            out.append(c + c)
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def declared_names(path):
    """What a header declares at namespace level: types, aliases, functions, constants, macros."""
    with open(path, encoding="utf-8", errors="replace") as f:
        raw = f.read()
    names = set(re.findall(r"^\s*#\s*define\s+(\w+)", raw, re.M))
    code = strip_code(raw)
    code = re.sub(r"^\s*#.*$", "", code, flags=re.M)  # preprocessor lines
    names.update(m.group(2) for m in re.finditer(
        r"\b(class|struct|union|enum(?:\s+class|\s+struct)?)\s+(?:\[\[[^\]]*\]\]\s*)?"
        r"([A-Za-z_]\w*)(?=\s*(?:final\b|[:{]))", code))
    names.update(re.findall(r"\busing\s+(\w+)\s*=", code))
    names.update(re.findall(r"\bTORCH_MODULE\s*\(\s*(\w+)\s*\)", code))
    # Statements at namespace level (inside no class or function body): functions and constants.
    depth_kinds, statement, statements = [], [], []
    for c in code:
        if c == "{":
            head = "".join(statement)
            is_namespace = re.search(r"\bnamespace\b[\w:\s]*$", head) is not None or \
                re.search(r'\bextern\s*"C"\s*$', head) is not None
            if all(depth_kinds) and not is_namespace:
                statements.append(head)  # a definition's head, or a class's
            depth_kinds.append(is_namespace)
            statement = []
        elif c == "}":
            if depth_kinds:
                depth_kinds.pop()
            statement = []
        elif c == ";":
            if all(depth_kinds):
                statements.append("".join(statement))
            statement = []
        else:
            statement.append(c)
    for head in statements:
        head = head.strip()
        if not head or re.match(r"(using|friend|typedef|namespace|template\s*<[^>]*>\s*$)\b",
                                head):
            continue
        previous = None
        while previous != head:  # template argument lists out, innermost first
            previous, head = head, re.sub(r"<[^<>;{}]*>", "", head)
        head = re.sub(r"\[\[[^\]]*\]\]", "", head)
        m = re.match(r"[^=(]*?([A-Za-z_]\w*)\s*\(", head)  # a function: the name before "("
        if m and not head.lstrip().startswith(("class", "struct", "enum", "union")):
            if m.group(1) not in KEYWORDS and not m.group(1).isupper():  # not a macro's call
                names.add(m.group(1))
            continue
        m = re.match(r"[^=(]*?([A-Za-z_]\w*)\s*(?:\[[^\]]*\])?\s*(?:=|\{|$)", head)
        if m and m.group(1) not in KEYWORDS and re.search(r"\b(constexpr|const|extern)\b", head):
            names.add(m.group(1))
    return names


def used_names(code):
    """Identifiers the code names, leaving out members reached through `.` or `->`."""
    return {m.group(0) for m in IDENT.finditer(code)
            if not re.search(r"(\.|->)\s*$", code[max(0, m.start() - 4):m.start()])}


def sources(root):
    for top in TOPS:
        for directory, dirs, names in os.walk(os.path.join(root, top)):
            dirs[:] = [d for d in dirs if d not in ("corpus", "results", "fixtures")]
            for name in sorted(names):
                if name.endswith(SOURCE_SUFFIXES):
                    yield os.path.join(directory, name)


def resolve(root, path, target):
    """The file a quoted include names, or None for headers outside this tree (LibTorch's)."""
    if target.startswith("dptrain/"):
        candidate = os.path.join(root, "lib", "include", target)
        return candidate if os.path.exists(candidate) else None
    for base in (os.path.dirname(path), os.path.join(root, "tests")):
        candidate = os.path.join(base, target)
        if os.path.exists(candidate):
            return candidate
    return None


def check(root):
    problems, cache = [], {}
    for path in sources(root):
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        code = strip_code(text)
        used = used_names(re.sub(r"^\s*#\s*include.*$", "", code, flags=re.M))
        stem = os.path.splitext(os.path.basename(path))[0]
        in_tests = os.path.relpath(path, root).split(os.sep)[0] == "tests"
        for match in QUOTED.finditer(text):
            target = match.group(1)
            if not target.startswith("dptrain/") and in_tests:
                continue  # tests' own helpers (support/) are held by their own tests
            header = resolve(root, path, target)
            if header is None or os.path.splitext(os.path.basename(header))[0] == stem:
                continue
            if header not in cache:
                cache[header] = declared_names(header)
            if cache[header] and not (cache[header] & used):
                line = text.count("\n", 0, match.start()) + 1
                problems.append(f'{os.path.relpath(path, root)}:{line}: includes "{target}" and '
                                f"uses nothing it declares")
    return problems


def self_test(root):
    """A copy of the tree with one unused include planted must fail, naming it."""
    with tempfile.TemporaryDirectory() as scratch:
        copy = os.path.join(scratch, "tree")
        for top in TOPS:
            shutil.copytree(os.path.join(root, top), os.path.join(copy, top),
                            ignore=shutil.ignore_patterns("*.bin", "results", "corpus",
                                                          "fixtures"))
        planted = os.path.join(copy, "lib", "src", "core", "random.cpp")
        with open(planted, encoding="utf-8") as f:
            text = f.read()
        with open(planted, "w", encoding="utf-8") as f:
            f.write(text.replace('#include "dptrain/core/random.h"',
                                 '#include "dptrain/core/random.h"\n#include "dptrain/core/sha256.h"',
                                 1))
        run = subprocess.run([sys.executable, os.path.abspath(__file__), copy],
                             capture_output=True, text=True)
        if run.returncode == 0 or 'lib/src/core/random.cpp' not in run.stdout or \
                "sha256.h" not in run.stdout:
            print("include self-test: a planted unused include was not caught:\n"
                  + run.stdout + run.stderr)
            return 1
        clean = subprocess.run([sys.executable, os.path.abspath(__file__), root],
                               capture_output=True, text=True)
        if clean.returncode != 0:
            print(clean.stdout + clean.stderr, end="")
            return 1
        print("include self-test: the planted include fails the check:\n  "
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
        print(f"includes: {len(problems)} unused; remove them")
        return 1
    print("includes: every quoted include of ours is used")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

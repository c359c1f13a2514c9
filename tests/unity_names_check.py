#!/usr/bin/env python3
"""The test binaries compile as unity builds (tests/CMakeLists.txt): the files of one binary are
included, a few at a time, into one translation unit. Two of those files defining the same name
at file scope is then either a redefinition the compiler rejects or, for functions of the same
name and different parameters, an overload set in which one file's call may silently pick the
other file's function. This check makes the second impossible: no name defined at file scope
(in a file's anonymous or named namespace, or outside any) in two files of one binary, and no
such function named as a function of the library's or the test support's headers, whose
namespaces the test files' `using namespace` lines open to the whole unity file.

The files of each binary are read from what CMake generated, every
<build>/tests/CMakeFiles/<binary>.dir/Unity/unity_*_cxx.cxx, so the check follows the build's
own lists. The names come from Universal Ctags (Debian's universal-ctags), which parses C++
declarations; what it names a lambda or a GoogleTest macro is left out.

    python3 tests/unity_names_check.py --build-dir build [--source-dir .]
    python3 tests/unity_names_check.py --self-test  # planted clashes in a temporary tree fail

Exits 1 naming each clash (the name, its files and lines), 2 on a usage error (no build
directory, no unity file, no ctags).
"""
import argparse
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

# Kinds that define a name at file scope. Members, locals and parameters belong to their
# class or function and cannot clash across files. Only functions (templates included) can
# clash silently; a variable or type defined twice is a redefinition the compiler rejects, so
# one Ctags does not see (`const torch::Device kCpu(torch::kCPU);`, read as a declaration)
# still cannot pass.
FILE_SCOPE_KINDS = {"function", "variable", "class", "struct", "union", "enum", "typedef",
                    "macro"}
# What Ctags reads as a function definition where GoogleTest's macros open a test body.
GTEST_MACROS = re.compile(r"^(TEST|TEST_F|TEST_P|TYPED_TEST|TYPED_TEST_P|"
                          r"INSTANTIATE_TEST_SUITE_P|INSTANTIATE_TYPED_TEST_SUITE_P|"
                          r"REGISTER_TYPED_TEST_SUITE_P|TYPED_TEST_SUITE|TYPED_TEST_SUITE_P|"
                          r"MATCHER|MATCHER_P|MATCHER_P2|ACTION|ACTION_P)$")
INCLUDE = re.compile(r'^#include\s+"([^"]+)"')
# Overloads by design: each file prints its own types (GoogleTest's PrintTo, operator<<) and
# overload resolution picks by the argument's type; two files printing one type is a
# redefinition the compiler rejects.
OVERLOADS_BY_DESIGN = re.compile(r"^(PrintTo|operator\s*.+)$")


def unity_binaries(build_dir):
    """{binary: [source files]} from the unity files CMake generated for the test binaries."""
    binaries = {}
    pattern = os.path.join(build_dir, "tests", "CMakeFiles", "*.dir", "Unity", "unity_*_cxx.cxx")
    for unity_file in sorted(glob.glob(pattern)):
        binary = os.path.basename(os.path.dirname(os.path.dirname(unity_file)))[:-len(".dir")]
        with open(unity_file, encoding="utf-8") as f:
            for line in f:
                match = INCLUDE.match(line.strip())
                if match:
                    binaries.setdefault(binary, []).append(os.path.realpath(match.group(1)))
    return binaries


def ctags(paths):
    """Ctags' tags of `paths`, as dictionaries (name, path, line, kind, scope, scopeKind)."""
    if not paths:
        return []
    command = ["ctags", "--output-format=json", "--fields=+nKZS", "--kinds-C++=+fvcsugtd",
               "--extras=-F", "-f", "-"] + sorted(set(paths))
    out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def at_file_scope(tag):
    if tag.get("kind") not in FILE_SCOPE_KINDS:
        return False
    name = tag["name"]
    if name.startswith("__anon") or GTEST_MACROS.match(name) or OVERLOADS_BY_DESIGN.match(name):
        return False
    scope_kind = tag.get("scopeKind")
    return scope_kind in (None, "namespace")


def header_functions(source_dir):
    """Names of the functions the library's public headers and the test support's declare."""
    headers = glob.glob(os.path.join(source_dir, "lib", "include", "**", "*.h"), recursive=True)
    headers += glob.glob(os.path.join(source_dir, "tests", "support", "*.h"))
    command = ["ctags", "--output-format=json", "--fields=+nKZS", "--kinds-C++=+p",
               "--extras=-F", "-f", "-"] + sorted(headers)
    out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    names = {}
    for line in out.splitlines():
        if not line.startswith("{"):
            continue
        tag = json.loads(line)
        if tag.get("kind") in ("function", "prototype") and tag.get("scopeKind") in (None,
                                                                                 "namespace"):
            names.setdefault(tag["name"], f"{os.path.relpath(tag['path'], source_dir)}:"
                                          f"{tag['line']}")
    return names


def defines_its_header(path, declared_at):
    """Whether `path` is the source file of the header that declares the function
    (tests/support/png_check.cpp defining what png_check.h declares)."""
    header = os.path.splitext(os.path.basename(declared_at.rsplit(":", 1)[0]))[0]
    return os.path.splitext(os.path.basename(path))[0] == header


def clashes(binaries, source_dir):
    """One line per name that two files of one binary define, or that a file defines as a
    function and a header declares."""
    library = header_functions(source_dir)
    problems = []
    for binary, files in sorted(binaries.items()):
        defined = {}  # name -> {file: line}
        for tag in ctags(files):
            if at_file_scope(tag):
                where = defined.setdefault(tag["name"], {})
                where.setdefault(os.path.realpath(tag["path"]), tag["line"])
                if (tag["kind"] == "function" and tag["name"] in library and
                        not defines_its_header(tag["path"], library[tag["name"]])):
                    problems.append(
                        f"{binary}: {tag['name']} is defined in "
                        f"{os.path.relpath(tag['path'], source_dir)}:{tag['line']} and declared "
                        f"in {library[tag['name']]}: rename the test's helper")
        for name, where in sorted(defined.items()):
            if len(where) > 1:
                places = ", ".join(f"{os.path.relpath(path, source_dir)}:{line}"
                                   for path, line in sorted(where.items()))
                problems.append(f"{binary}: {name} is defined at file scope in {len(where)} "
                                f"files of one unity build ({places}): rename all but one")
    return problems


def self_test():
    """A temporary source tree and build tree holding one unity binary of two test files: clean
    it passes; each planted clash fails, naming the name and both places."""
    clean = {
        "lib/include/dptrain/core/files.h": "namespace dptrain {\nvoid write_all(int fd);\n}\n",
        "tests/support/png_check.h": "namespace dptrain::testing {\nint read_png(int x);\n}\n",
        "tests/support/png_check.cpp":
            "namespace dptrain::testing {\nint read_png(int x) { return x; }\n}\n",
        "tests/a/test_one.cpp": "namespace {\nint scale(int x) { return 2 * x; }\n"
                                "void PrintTo(int, void*) {}\n}\n",
        "tests/a/test_two.cpp": "namespace dptrain {\nnamespace {\n"
                                "struct Fixture { int scale(int x) { return x; } };\n}\n}\n",
    }
    plants = [
        ("an overload in another file", "tests/a/test_two.cpp",
         "namespace {\ndouble scale(double x) { return x; }\n}\n",
         ["scale is defined at file scope in 2 files", "tests/a/test_one.cpp:2",
          "tests/a/test_two.cpp:7"]),
        ("a library function's name", "tests/a/test_two.cpp",
         "namespace dptrain {\nnamespace {\nvoid write_all(const char* path) {}\n}\n}\n",
         ["write_all is defined in tests/a/test_two.cpp:8 and declared in "
          "lib/include/dptrain/core/files.h:2"]),
        ("a template in another file", "tests/a/test_two.cpp",
         "template <typename T>\nT scale(T x) { return x; }\n",
         ["scale is defined at file scope in 2 files"]),
    ]
    failures = []
    for label, path, text, expected in [("clean", None, None, [])] + plants:
        with tempfile.TemporaryDirectory() as root:
            files = dict(clean)
            if path:
                files[path] = files[path] + text
            for relative, content in files.items():
                os.makedirs(os.path.dirname(os.path.join(root, relative)), exist_ok=True)
                with open(os.path.join(root, relative), "w", encoding="utf-8") as f:
                    f.write(content)
            unity = os.path.join(root, "build", "tests", "CMakeFiles", "a_tests.dir", "Unity")
            os.makedirs(unity)
            with open(os.path.join(unity, "unity_0_cxx.cxx"), "w", encoding="utf-8") as f:
                for relative in ("tests/a/test_one.cpp", "tests/a/test_two.cpp",
                                 "tests/support/png_check.cpp"):
                    f.write(f'#include "{os.path.join(root, relative)}"\n')
            problems = clashes(unity_binaries(os.path.join(root, "build")), os.path.realpath(root))
            if not expected and problems:
                failures.append(f"{label}: reported {problems}")
            if expected and not (len(problems) == 1 and
                                 all(part in problems[0] for part in expected)):
                failures.append(f"{label}: expected one clash naming {expected}, got {problems}")
    for failure in failures:
        print(f"unity_names_check --self-test: {failure}")
    print(f"unity_names_check --self-test: {len(plants) + 1 - len(failures)} of "
          f"{len(plants) + 1} cases as expected")
    return 1 if failures else 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build-dir")
    parser.add_argument("--source-dir", default=os.path.join(os.path.dirname(__file__), ".."))
    parser.add_argument("--self-test", action="store_true")
    args = parser.parse_args()
    if shutil.which("ctags") is None:
        print("unity_names_check: ctags not found (Debian's universal-ctags)", file=sys.stderr)
        return 2
    if args.self_test:
        return self_test()
    if not args.build_dir:
        parser.error("--build-dir is needed (or --self-test)")
    binaries = unity_binaries(args.build_dir)
    if not binaries:
        print(f"unity_names_check: no unity file under {args.build_dir}/tests/CMakeFiles "
              "(configured with -DDPTRAIN_UNITY_TESTS=OFF, or not the build directory?)",
              file=sys.stderr)
        return 2
    problems = clashes(binaries, os.path.realpath(args.source_dir))
    for problem in problems:
        print(problem)
    files = sum(len(f) for f in binaries.values())
    print(f"unity_names_check: {len(binaries)} binaries, {files} files, "
          f"{len(problems)} clashes")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Include what you use, in lib/ and app/: runs clang-tidy's misc-include-cleaner (its options in
.clang-tidy) over every source and header there with the build's compile_commands.json, a
process per core, and fails on each include nothing uses and each name whose header is not
included. LibTorch's headers are left out both ways (.clang-tidy says why). Not here: tests/,
fuzz/ and bench/ (their includes serve GoogleTest and the fuzzers' own builds).

    python3 tests/include_check.py --build BUILD [--clang-tidy PATH] [--only FILE...] [--fix]
                                   [ROOT]       # the check; --fix edits the includes as it says
    python3 tests/include_check.py --build BUILD --self-test  # plants an unused and a missing
                                                              # include in a copy, which must fail

clang-tidy is PyPI's wheel, pinned in scripts/test-venv.sh (Debian 12's is version 14, which lacks
the check). When it fails, remove the include or include the header that declares the name.
"""
import argparse
import concurrent.futures
import json
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import self_test as self_test_support  # noqa: E402

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Sources first, the longest first, so that the last process to finish is a short one.
PATTERNS = [("lib/src", ".cpp"), ("app", ".cpp"), ("lib/include/dptrain", ".h"), ("lib/src", ".h"),
            ("app", ".h")]
FINDING = re.compile(r"^(.*?):(\d+):(\d+): (?:warning|error): (.*?)(?: \[[\w.-]+\])?$", re.M)
# Compiled only under DPTRAIN_WITH_CUDA: CI's build has no CUDA headers to parse it with.
CUDA_ONLY = ("lib/src/train/cuda_event.h",)


def files(root):
    found = []
    for top, suffix in PATTERNS:
        for directory, _, names in os.walk(os.path.join(root, top)):
            found += [os.path.join(directory, n) for n in names if n.endswith(suffix)]
    found = [p for p in found if os.path.relpath(p, root) not in CUDA_ONLY]
    return sorted(dict.fromkeys(found), key=lambda p: (not p.endswith(".cpp"),
                                                       -os.path.getsize(p)))


def source_dir(build):
    with open(os.path.join(build, "CMakeCache.txt"), encoding="utf-8") as f:
        return re.search(r"^CMAKE_HOME_DIRECTORY:INTERNAL=(.*)$", f.read(), re.M).group(1)


PCH_FLAGS = re.compile(r" -Winvalid-pch| -include \S*cmake_pch\.hxx| -Xclang -include-pch -Xclang \S+"
                       r"| -Xclang -include -Xclang \S*cmake_pch\.hxx")
# The targets that compile a source a second time without an optional library.
WITHOUT_OPTIONAL_PIECES = ("dptrain_without_optional_pieces", "dptrain_download_without_curl")


def compile_database(build, root, scratch):
    """The folder of a compile_commands.json for the tree at `root`: the build's, less the second
    compilation of some sources without the optional pieces (lib/CMakeLists.txt, and app/'s
    downloader without libcurl; clang-tidy would check both and call unused what only the full
    build uses), and for another tree (a copy, in
    the self-test) with lib/ and app/ pointed at `root`."""
    source = os.path.realpath(source_dir(build))
    with open(os.path.join(build, "compile_commands.json"), encoding="utf-8") as f:
        entries = [e for e in json.load(f)
                   if not any(target in e.get("output", e["command"])
                              for target in WITHOUT_OPTIONAL_PIECES)]
    # The precompiled header CMake forces into each source (lib/CMakeLists.txt): clang-tidy reads
    # each source as written, with only what it includes itself.
    for e in entries:
        e["command"] = PCH_FLAGS.sub("", e["command"])
    text = json.dumps(entries)
    if source != os.path.realpath(root):
        for top in ("lib", "app"):
            text = text.replace(f"{source}/{top}/", f"{root}/{top}/")
    with open(os.path.join(scratch, "compile_commands.json"), "w", encoding="utf-8") as f:
        f.write(text)
    return scratch


def openmp_folder(scratch):
    """A folder holding GCC's omp.h, which LibTorch's headers include and clang-tidy's own
    headers lack: an -isystem for clang-tidy."""
    omp = subprocess.run(["g++", "-print-file-name=include/omp.h"], capture_output=True,
                         text=True).stdout.strip()
    folder = os.path.join(scratch, "openmp")
    os.makedirs(folder)
    if os.path.isabs(omp):
        os.symlink(omp, os.path.join(folder, "omp.h"))
    return folder


def tidy(clang_tidy, database, openmp, root, path, fix):
    """misc-include-cleaner's findings in one file, and any error that stopped it, as lines
    relative to `root` (with `fix`, the file's includes edited as the check suggests)."""
    run = subprocess.run([clang_tidy, "--quiet", "-p", database, *(["--fix"] if fix else []),
                          f"--extra-arg=-isystem{openmp}",
                          f"--config-file={os.path.join(root, '.clang-tidy')}", path],
                         capture_output=True, text=True)
    findings = [f"{os.path.relpath(m.group(1), root)}:{m.group(2)}: {m.group(4)}"
                for m in FINDING.finditer(run.stdout)]
    if run.returncode != 0 and not findings:
        findings.append(f"{os.path.relpath(path, root)}: clang-tidy failed:\n"
                        + (run.stdout + run.stderr).strip())
    return findings


def check(clang_tidy, build, root, only, fix=False):
    paths = [os.path.join(root, p) for p in only] if only else files(root)
    with tempfile.TemporaryDirectory() as scratch, \
            concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        database, openmp = compile_database(build, root, scratch), openmp_folder(scratch)
        results = pool.map(lambda p: tidy(clang_tidy, database, openmp, root, p, fix), paths)
        return [finding for result in results for finding in result], len(paths)


def self_test(args):
    """A copy with an unused include and a missing one planted in one source must fail there."""
    planted = "lib/src/core/random.cpp"

    def unused(copy):
        self_test_support.replace_once(
            os.path.join(copy, planted), '#include "dptrain/core/random.h"\n',
            '#include "dptrain/core/random.h"\n#include "dptrain/core/sha256.h"\n')

    def missing(copy):  # std::vector then comes only through random.h
        self_test_support.replace_once(os.path.join(copy, planted), "#include <vector>\n", "")
    plants = [(unused, [planted, "sha256.h", "not used"]),
              (missing, [planted, "std::vector", "no header providing"])]
    extra = ["--build", args.build, "--clang-tidy", args.clang_tidy, "--only", planted, "--"]
    return self_test_support.run_self_test("include", os.path.abspath(__file__), HERE,
                                           ("lib", "app", ".clang-tidy"), plants, extra)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", required=True, help="a build folder with compile_commands.json")
    parser.add_argument("--clang-tidy", default=os.path.join(
        os.path.dirname(sys.executable), "clang-tidy"), help="clang-tidy 18 or later")
    parser.add_argument("--only", nargs="*", default=[], help="files to check, from ROOT")
    parser.add_argument("--fix", action="store_true", help="edit the includes as it suggests")
    parser.add_argument("--self-test", action="store_true")
    parser.add_argument("root", nargs="?", default=HERE)
    args = parser.parse_args()
    args.build, args.root = os.path.abspath(args.build), os.path.abspath(args.root)
    if not os.access(args.clang_tidy, os.X_OK):
        print(f"includes: no clang-tidy at {args.clang_tidy}; run scripts/test-venv.sh, which "
              f"installs the pinned one")
        return 1
    if not os.path.exists(os.path.join(args.build, "compile_commands.json")):
        print(f"includes: no {args.build}/compile_commands.json; configure with BUILD_TESTING=ON")
        return 1
    if args.self_test:
        return self_test(args)
    findings, count = check(args.clang_tidy, args.build, args.root, args.only,
                             args.fix)
    for finding in findings:
        print(finding)
    if findings:
        print(f"includes: {len(findings)} finding(s) in {count} files; remove the include, or "
              f"include the header that declares the name")
        return 1
    print(f"includes: every include of the {count} files of lib/ and app/ is used, and every "
          f"name's header included")
    return 0


if __name__ == "__main__":
    sys.exit(main())

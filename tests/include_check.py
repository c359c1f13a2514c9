#!/usr/bin/env python3
"""Include what you use, in lib/ and app/: runs clang-tidy's misc-include-cleaner (its options in
.clang-tidy) over every source and header there with the build's compile_commands.json, a
process per core, and fails on each include nothing uses and each name whose header is not
included. LibTorch's headers are left out both ways (.clang-tidy says why). Not here: tests/,
fuzz/ and bench/ (their includes serve GoogleTest and the fuzzers' own builds).

    python3 tests/include_check.py --build BUILD [--clang-tidy PATH] [--only FILE...] [--fix]
                                   [--all] [--update-verified] [ROOT]
                                                # the check; --fix edits the includes as it says
    python3 tests/include_check.py --build BUILD --self-test  # plants an unused and a missing
                                                              # include in a copy, which must fail

Files whose inputs are those of an earlier passing check are not checked again (Note [Files
verified earlier]): after changing lib/ or app/, run it with --update-verified and commit
tests/include_check_verified.txt with the change; --all checks every file.

clang-tidy is PyPI's wheel, pinned in scripts/test-venv.sh (Debian 12's is version 14, which lacks
the check). When it fails, remove the include or include the header that declares the name.
"""
import argparse
import concurrent.futures
import hashlib
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
VERIFIED = os.path.join(HERE, "tests", "include_check_verified.txt")
QUOTED_INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)

# Note [Files verified earlier]
# clang-tidy spends some 6 to 11 s of CPU on each file, nearly all of it parsing LibTorch's
# headers, so the whole check takes 3.5 minutes of CI's two cores on an AVX-512 EPYC and 10.5 on
# an AVX2 one (bench/results/2026-12-04-ci-times.md). Its verdict on a file is a function of its
# inputs: the file, the files of ours it includes (transitively), its compile flags, the
# .clang-tidy options and the tools and libraries (clang-tidy, the compiler, glibc, LibTorch,
# protoc). tests/include_check_verified.txt holds, for each file of the last passing check, a
# SHA-256 of all of them (verified_key); a file whose key is there passed with exactly these
# inputs and is not parsed again. A key differs, and the file is checked, when any input
# differs: a change to the file or to a header of ours it reaches, other flags, another
# LibTorch (2.x), a newer compiler. So a stale list costs time, never a finding: a commit that
# changes lib/ or app/ without --update-verified is checked in full where it changed. Includes of
# ours are followed by their quoted #include lines (any branch of an #if: more inputs, not fewer).


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


def version(command):
    try:
        return subprocess.run(command, capture_output=True, text=True).stdout.strip()
    except OSError:
        return "absent"


def tool_inputs(clang_tidy, build, root):
    """What every file's verdict depends on besides its own sources and flags: the tools and
    libraries, as text."""
    with open(os.path.join(build, "CMakeCache.txt"), encoding="utf-8") as f:
        torch_dir = re.search(r"^Torch_DIR:PATH=(.*)$", f.read(), re.M)
    torch_version = ""
    if torch_dir:
        version_file = os.path.join(torch_dir.group(1), "TorchConfigVersion.cmake")
        if os.path.exists(version_file):
            with open(version_file, encoding="utf-8") as f:
                torch_version = f.read()
    with open(os.path.join(root, ".clang-tidy"), encoding="utf-8") as f:
        config = f.read()
    return "\n".join([version([clang_tidy, "--version"]), config,
                      version(["g++", "-dumpfullversion"]),
                      os.confstr("CS_GNU_LIBC_VERSION") or "", torch_version,
                      version(["protoc", "--version"])])


def ours_included(path, root, found):
    """Adds to `found` the files of ours that `path` includes, and theirs (quoted includes,
    resolved beside the includer, then in lib/include; a protoc header by its .proto); a name
    found nowhere is kept as a name."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    for name in QUOTED_INCLUDE.findall(text):
        for candidate in (os.path.join(os.path.dirname(path), name),
                          os.path.join(root, "lib", "include", name)):
            if os.path.isfile(candidate):
                candidate = os.path.realpath(candidate)
                if candidate not in found:
                    found.add(candidate)
                    ours_included(candidate, root, found)
                break
        else:
            # protoc's header, generated from the .proto beside the includer: that file counts.
            proto = os.path.join(os.path.dirname(path), name[:-len(".pb.h")] + ".proto")
            if name.endswith(".pb.h") and os.path.isfile(proto):
                found.add(os.path.realpath(proto))
            else:
                found.add("unresolved:" + name)


def normalised_commands(database, build, root):
    """{source path: its compile command without paths of this clone or build}."""
    with open(os.path.join(database, "compile_commands.json"), encoding="utf-8") as f:
        entries = json.load(f)
    commands = {}
    for e in entries:
        words = e["command"].split()
        kept = [w for i, w in enumerate(words) if w not in ("-o", "-c") and
                (i == 0 or words[i - 1] not in ("-o", "-c"))]
        text = " ".join(kept).replace(os.path.realpath(build), "BUILD").replace(
            os.path.realpath(root), "ROOT")
        commands[os.path.realpath(os.path.join(e["directory"], e["file"]))] = text
    return commands


def verified_key(path, root, tools, commands):
    """SHA-256 of every input of the check's verdict on `path` (Note [Files verified earlier])."""
    digest = hashlib.sha256(tools.encode())
    real = os.path.realpath(path)
    # A header has no command of its own: clang-tidy borrows a source's, so all of them count.
    flags = [commands[real]] if real in commands else sorted(set(commands.values()))
    digest.update("\n".join(flags).encode())
    inputs = {real}
    ours_included(real, root, inputs)
    for item in sorted(inputs):
        if item.startswith("unresolved:"):
            digest.update(item.encode())
            continue
        with open(item, "rb") as f:
            digest.update(os.path.relpath(item, root).encode() + b"\0" +
                          hashlib.sha256(f.read()).digest())
    return digest.hexdigest()


def read_verified():
    """{relative path: key} of tests/include_check_verified.txt, or {} without it."""
    if not os.path.exists(VERIFIED):
        return {}
    verified = {}
    with open(VERIFIED, encoding="utf-8") as f:
        for line in f:
            if line.strip() and not line.startswith("#"):
                name, key = line.split()
                verified[name] = key
    return verified


def write_verified(keys):
    lines = ["# Written by tests/include_check.py --update-verified: each file of lib/ and app/ "
             "that passed,",
             "# with the SHA-256 of the inputs it passed with (Note [Files verified earlier]).",
             *[f"{name} {key}" for name, key in sorted(keys.items())]]
    with open(VERIFIED, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


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


def check(clang_tidy, build, root, only, fix=False, use_verified=False, update_verified=False):
    """(findings, files checked, files verified earlier and skipped)."""
    paths = [os.path.join(root, p) for p in only] if only else files(root)
    with tempfile.TemporaryDirectory() as scratch, \
            concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        database, openmp = compile_database(build, root, scratch), openmp_folder(scratch)
        keys = {}
        if use_verified or update_verified:
            tools = tool_inputs(clang_tidy, build, root)
            commands = normalised_commands(database, build, root)
            keys = {os.path.relpath(p, root): verified_key(p, root, tools, commands)
                    for p in paths}
        verified = read_verified() if use_verified else {}
        unchecked = [p for p in paths if verified.get(os.path.relpath(p, root)) !=
                     keys.get(os.path.relpath(p, root), "")]
        results = pool.map(lambda p: tidy(clang_tidy, database, openmp, root, p, fix), unchecked)
        findings = [finding for result in results for finding in result]
        if update_verified and not findings:
            write_verified(keys)
        return findings, len(unchecked), len(paths) - len(unchecked)


def staleness_guard_fails(build):
    """configured_before on a tree of one CMakeLists.txt, before and after the build's database
    (a newer file in a build folder of the tree does not count): the wrong verdict, or None."""
    made = os.path.getmtime(os.path.join(build, "compile_commands.json"))
    with tempfile.TemporaryDirectory() as root:
        for folder in ("lib", "build-x"):
            os.makedirs(os.path.join(root, folder))
            with open(os.path.join(root, folder, "CMakeLists.txt"), "w", encoding="utf-8"):
                pass
        lists = os.path.join(root, "lib", "CMakeLists.txt")
        os.utime(os.path.join(root, "build-x", "CMakeLists.txt"), (made + 60, made + 60))
        for offset, expected in ((-60, None), (60, os.path.join("lib", "CMakeLists.txt"))):
            os.utime(lists, (made + offset, made + offset))
            found = configured_before(build, root)
            if found != expected:
                return f"a CMakeLists.txt {offset:+d} s from the database gave {found!r}"
    return None


def self_test(args):
    """A copy with an unused include and a missing one planted in one source must fail there;
    --update-verified must refuse a build configured before a CMake file changed."""
    wrong = staleness_guard_fails(args.build)
    if wrong:
        print(f"include self-test: --update-verified's check of the build folder failed: {wrong}")
        return 1
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


def configured_before(build, root):
    """A CMake file of the tree newer than the build's compile_commands.json, or None: keys made
    from such a build would hold flags that a fresh build no longer has, and a fresh clone would
    check every file again."""
    made = os.path.getmtime(os.path.join(build, "compile_commands.json"))
    for directory, folders, names in os.walk(root):
        folders[:] = [f for f in folders if not f.startswith((".", "build"))]
        for name in names:
            path = os.path.join(directory, name)
            if (name == "CMakeLists.txt" or name.endswith(".cmake")) and \
                    os.path.getmtime(path) > made:
                return os.path.relpath(path, root)
    return None


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", required=True, help="a build folder with compile_commands.json")
    parser.add_argument("--clang-tidy", default=os.path.join(
        os.path.dirname(sys.executable), "clang-tidy"), help="clang-tidy 18 or later")
    parser.add_argument("--only", nargs="*", default=[], help="files to check, from ROOT")
    parser.add_argument("--fix", action="store_true", help="edit the includes as it suggests")
    parser.add_argument("--all", action="store_true",
                        help="check every file, also those verified earlier")
    parser.add_argument("--update-verified", action="store_true",
                        help="when every file passes, write tests/include_check_verified.txt")
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
    this_checkout = os.path.realpath(args.root) == os.path.realpath(HERE)
    if args.update_verified and (args.only or args.fix or not this_checkout):
        print("includes: --update-verified takes the whole tree of this checkout, without --only "
              "or --fix")
        return 1
    if args.update_verified:
        stale = configured_before(args.build, args.root)
        if stale:
            print(f"includes: {args.build} was configured before {stale} last changed, so its "
                  f"compile commands are not this tree's; build it, then --update-verified")
            return 1
    # The list of verified files speaks of this checkout's tree only (not of a copy's).
    use_verified = not (args.all or args.only or args.fix) and this_checkout
    findings, count, skipped = check(args.clang_tidy, args.build, args.root, args.only,
                                     args.fix, use_verified, args.update_verified)
    for finding in findings:
        print(finding)
    if findings:
        print(f"includes: {len(findings)} finding(s) in {count} files; remove the include, or "
              f"include the header that declares the name")
        return 1
    earlier = (f"; {skipped} more passed earlier with the same inputs "
               f"(tests/include_check_verified.txt)" if skipped else "")
    print(f"includes: every include of the {count} files of lib/ and app/ checked is used, and "
          f"every name's header included{earlier}")
    if args.update_verified:
        print(f"includes: wrote {os.path.relpath(VERIFIED, HERE)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env bash
# Builds dptrain's library, driver and tests with AddressSanitizer and UBSan (DPTRAIN_SANITIZE)
# into build-asan, or $DPTRAIN_ASAN_BUILD_DIR, and runs the quick tests under them: file formats,
# batching, random numbers, the command line, the rendezvous, the reducer. Not the training and
# multi-process tests: they spend minutes in LibTorch, which is not instrumented.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir="${DPTRAIN_ASAN_BUILD_DIR:-build-asan}"
suppressions="$PWD/tests/sanitizers"

# LibTorch is not instrumented; what it trips is suppressed, each entry with its reason, in
# tests/sanitizers/. These also hold while the build runs the test binary to list its tests.
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:strict_string_checks=1:check_initialization_order=1"
export LSAN_OPTIONS="suppressions=$suppressions/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS="suppressions=$suppressions/ubsan.supp:print_stacktrace=1:halt_on_error=1"

# -O1: quicker to build than -O2, still fast enough to run; -g1: line numbers in the stacks.
# Debug keeps assert() on. No -Werror: under ASan, GCC 12 warns of maybe-uninitialized members
# inside libstdc++'s <regex> (cxxopts uses it), a false positive; scripts/build.sh keeps -Werror.
cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-O1 -g1" \
  -DCMAKE_CXX_COMPILER="${DPTRAIN_ASAN_CXX:-g++}" -DDPTRAIN_SANITIZE=ON -DBUILD_TESTING=ON \
  -DDPTRAIN_WERROR=OFF >/dev/null
cmake --build "$build_dir" -j "${DPTRAIN_ASAN_JOBS:-$(nproc)}" --target dptrain_tests dptrain_app

# The quick suites in full. Of the tests that start the dptrain binary (some 2 s each under
# ASan, loading LibTorch) one per kind: help, a usage error, a data error, an environment error,
# a tiny training run that saves, a failing save, a small stack, an unprivileged user, a full
# stdout, FIFOs given as files, writes past the file-size limit, and an eval of saved weights
# beside a refused archive. CliParse covers the parser in process.
quick="IdxReader.*:*IdxCorruption.*:Data*:*DataMissingFile.*:*DataBadImageShape.*"
quick+=":Batching*:*Batching*:Random*:*Random*"
quick+=":CliParse.*:CliHelp.TrainHelpShowsTheDefaults:*CliErrors.*/unknown_command"
quick+=":*CliDataErrors.*/corrupt_gzip:CliErrorsEnvironment.*"
quick+=":CliRun.TinyDataTwoEpochsSavesTheModel:CliRun.UnwritableSaveModelIsAUsageErrorBeforeTraining"
quick+=":*CliErrors.*/save_model_is_a_device:CliLostWork.FifosAreRefusedAtOnce"
quick+=":CliLostWork.WritesPastTheFileSizeLimitAreOneErrorLineAndLeaveNothing:RunSettings.*"
quick+=":CliStack.*:CliDataPermissions.*:CliOutput.FullStdoutIsARunTimeError"
quick+=":CheckWorld.*:CheckData.*:DownloadRedaction.*:DownloadDefaults.*"
quick+=":Communicator.*:Rendezvous.*:LaunchEnvironment*:*LaunchEnvironmentErrors.*"
quick+=":BucketAssignment.*:Reducer.*:*ReducerWorld.*"
quick+=":Checkpoint*:*Checkpoint*:Sha256*:*Sha256*:Metrics*:*Metrics*:PlotPngCheck.*"
quick+=":BatchAssembler*:*BatchAssembler*:*PlanWorld.*:ChooseBackend.*"
quick+=":Report.*:MemoryBudget.*:NcclEnvironment.*:CheckPlacements.*:CheckWorld.*"
quick+=":CachingCpuAllocator*:CpuAllocatorNames.*:AllFinite.*:DefaultIntraOpThreads.*"
quick+=":*FusedBatchNorm*:*Projection*"
quick+=":Printable.*:FreshStart.*:RunRecords.*:*DownloadPlantedPart.*:*DownloadFlood.*"
quick+=":HostileWeights.ArchivesAreRefusedAndSavedModelsEvaluate"
# Not under ASan: its shadow memory takes address space an RLIMIT_AS test cannot budget for, and
# its own SIGSEGV handler reports the guarded allocator's faults before the tests can see them.
quick+="-CachingCpuAllocatorDeathTest.OutOfMemoryGivesTheCacheBackBeforeFailing"
"$build_dir/tests/dptrain_tests" --gtest_filter="$quick" --gtest_brief=1
echo "sanitize: the quick tests pass under AddressSanitizer and UBSan"

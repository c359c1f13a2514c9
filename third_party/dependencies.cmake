# The one place where dptrain finds outside libraries.
# LibTorch: find_package(Torch) -- Debian's 1.13 by default, or a CUDA LibTorch 2.x through
# CMAKE_PREFIX_PATH, whose CUDA toolkit is found first (cuda_toolkit.cmake) and whose NCCL header
# is checked against it after (nccl.cmake). cxxopts (3 or newer) and GoogleTest: Debian's packages, else a pinned
# FetchContent (FETCHCONTENT_SOURCE_DIR_<NAME> points it at local sources: the device kit).
# zlib and OpenSSL's libcrypto (SHA-256): required. libcurl (dptrain download) and Gloo's headers
# (--backend gloo): used when found, see DPTRAIN_DOWNLOAD and DPTRAIN_GLOO. libpng: the plot test
# (DPTRAIN_PLOT_RENDER_TEST). Every search also looks under CMAKE_PREFIX_PATH.
include(FetchContent)
include(CheckCXXSourceCompiles)

# dptrain_fail(TEXT...): stops the configure with TEXT as one unwrapped line on stderr
# ("dptrain: error: ..."), where a user's search for the cause starts; FATAL_ERROR's own block
# (which CMake wraps at 80 columns) only points at it.
function(dptrain_fail)
  string(CONCAT text ${ARGN})
  message(NOTICE "dptrain: error: ${text}")
  message(FATAL_ERROR "dptrain: configure stopped: see the 'dptrain: error:' line above")
endfunction()

set(DPTRAIN_GLOO AUTO CACHE STRING
    "--backend gloo: AUTO (when this LibTorch has Gloo and Gloo headers that compile against it are found) or OFF")
set(DPTRAIN_DOWNLOAD AUTO CACHE STRING
    "dptrain download: AUTO (when libcurl is found) or OFF")
set_property(CACHE DPTRAIN_GLOO PROPERTY STRINGS AUTO OFF)
set_property(CACHE DPTRAIN_DOWNLOAD PROPERTY STRINGS AUTO OFF)
foreach(knob DPTRAIN_GLOO DPTRAIN_DOWNLOAD)
  if(NOT ${knob} MATCHES "^(AUTO|OFF)$")
    message(FATAL_ERROR "${knob} must be AUTO or OFF, not '${${knob}}'")
  endif()
endforeach()

# dptrain_probe_torch_header(RESULT SOURCE INCLUDES DEFINITIONS): whether SOURCE, which includes
# LibTorch headers, compiles (no link) with the include folders and compile definitions given as
# lists and LibTorch's flags, as dptrain's own sources are compiled; cached in RESULT. The Gloo
# and NCCL probes use it.
function(dptrain_probe_torch_header result source includes definitions)
  set(CMAKE_REQUIRED_QUIET ON)
  set(CMAKE_TRY_COMPILE_TARGET_TYPE STATIC_LIBRARY)  # headers only: nothing to link
  set(CMAKE_REQUIRED_INCLUDES ${includes})
  set(CMAKE_REQUIRED_FLAGS "-std=c++17 ${TORCH_CXX_FLAGS}")
  set(CMAKE_REQUIRED_DEFINITIONS)
  foreach(definition IN LISTS definitions)
    list(APPEND CMAKE_REQUIRED_DEFINITIONS -D${definition})
  endforeach()
  check_cxx_source_compiles("${source}" ${result})
  set(${result} "${${result}}" PARENT_SCOPE)
endfunction()

# ---- LibTorch ---------------------------------------------------------------
include(${CMAKE_CURRENT_LIST_DIR}/cuda_toolkit.cmake)
dptrain_prepare_cuda_toolkit()
find_package(Torch REQUIRED)
if(Torch_VERSION VERSION_LESS 1.13)
  message(FATAL_ERROR "dptrain needs LibTorch 1.13 or newer, found ${Torch_VERSION}")
endif()
# TorchConfig exposes its targets plus TORCH_CXX_FLAGS (the C++ ABI switch); wrap both in one
# imported target so that nothing edits the global flags.
add_library(dptrain_torch INTERFACE)
target_link_libraries(dptrain_torch INTERFACE ${TORCH_LIBRARIES})
separate_arguments(dptrain_torch_flags UNIX_COMMAND "${TORCH_CXX_FLAGS}")
target_compile_options(dptrain_torch INTERFACE ${dptrain_torch_flags})
# Treat LibTorch's headers as system headers so that their warnings are not ours.
get_target_property(dptrain_torch_includes torch INTERFACE_INCLUDE_DIRECTORIES)
if(dptrain_torch_includes)
  target_include_directories(dptrain_torch SYSTEM INTERFACE ${dptrain_torch_includes})
endif()

# Which collective backends this LibTorch carries, decided once here (see lib/CMakeLists.txt).
if(TARGET torch_cuda)
  set(DPTRAIN_WITH_CUDA ON)
else()
  set(DPTRAIN_WITH_CUDA OFF)
endif()
message(STATUS "dptrain: LibTorch ${Torch_VERSION} (${TORCH_INSTALL_PREFIX})")
message(STATUS "dptrain: CUDA support: ${DPTRAIN_WITH_CUDA}")
include(${CMAKE_CURRENT_LIST_DIR}/nccl.cmake)

# ---- Gloo headers: --backend gloo ---------------------------------------------------
# PyPI's LibTorch carries Gloo inside but not its headers, which ProcessGroupGloo.hpp includes.
# Headers of another Gloo (Debian's libgloo-dev, the device kit's copy) may not compile against
# this LibTorch's c10d, so AUTO compiles that header once with them and leaves Gloo out, saying
# so, when it fails. Without Gloo, --backend gloo is refused with one line (distributed.cpp).
set(DPTRAIN_WITH_GLOO OFF)
if(DPTRAIN_GLOO STREQUAL "AUTO")
  find_path(DPTRAIN_GLOO_INCLUDE_DIR gloo/algorithm.h)
  if(DPTRAIN_GLOO_INCLUDE_DIR)
    get_target_property(torch_definitions torch_cpu INTERFACE_COMPILE_DEFINITIONS)
    dptrain_probe_torch_header(DPTRAIN_GLOO_COMPILES [[
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#if !defined(USE_C10D_GLOO)
#error "this LibTorch was built without Gloo"
#endif
int dptrain_gloo_probe() { return static_cast<int>(sizeof(c10d::ProcessGroupGloo::Options)); }
]] "${dptrain_torch_includes};${DPTRAIN_GLOO_INCLUDE_DIR}" "${torch_definitions}")
    if(DPTRAIN_GLOO_COMPILES)
      set(DPTRAIN_WITH_GLOO ON)
    else()
      message(STATUS "dptrain: the Gloo headers in ${DPTRAIN_GLOO_INCLUDE_DIR} do not compile "
                     "against this LibTorch's ProcessGroupGloo.hpp (or it has no Gloo)")
    endif()
  endif()
endif()
message(STATUS "dptrain: Gloo support (--backend gloo): ${DPTRAIN_WITH_GLOO} "
               "(headers: ${DPTRAIN_GLOO_INCLUDE_DIR})")

# ---- OpenMP -----------------------------------------------------------------
# LibTorch's at::parallel_for is a header template that runs its loop in parallel only where the
# calling file is compiled with OpenMP (both LibTorch builds we use run on OpenMP); the fused
# BatchNorm's loops (fused_batch_norm.cpp) use it.
find_package(OpenMP REQUIRED COMPONENTS CXX)

# ---- zlib -------------------------------------------------------------------
find_package(ZLIB REQUIRED)
message(STATUS "dptrain: zlib: ${ZLIB_LIBRARIES}")

# ---- OpenSSL's libcrypto: SHA-256 (sha256.h) of downloaded files and of the training data --------
# The device kit brings its headers and static library (OPENSSL_ROOT_DIR, OPENSSL_USE_STATIC_LIBS).
find_package(OpenSSL REQUIRED COMPONENTS Crypto)

# ---- libcurl: fetching the data set (http, https, file) ----------------------------
# Optional: a machine without libcurl's headers (the GPU machine's image) builds dptrain
# without `download`, which then says so; the data are copied there instead.
set(DPTRAIN_WITH_CURL OFF)
if(DPTRAIN_DOWNLOAD STREQUAL "AUTO")
  find_package(CURL QUIET)
  if(CURL_FOUND)
    set(DPTRAIN_WITH_CURL ON)
  endif()
endif()
message(STATUS "dptrain: libcurl (dptrain download): ${DPTRAIN_WITH_CURL}")

# ---- Python with torch: torchrun for the multi-process tests ----------------------
# The first interpreter whose torch has the same major.minor version as the LibTorch found:
# torchrun's store and ours must speak the same protocol (1.13 and 2.x do not). Candidates:
# the interpreter of the environment LibTorch came from (a PyPI wheel in a venv), the default
# Python, Debian's. DPTRAIN_TORCHRUN_PYTHON may name it instead. Empty when none: those tests
# then skip, saying so.
if(NOT DEFINED DPTRAIN_TORCHRUN_PYTHON)
  set(DPTRAIN_TORCHRUN_PYTHON "")
  find_package(Python3 COMPONENTS Interpreter QUIET)
  get_filename_component(torch_env "${TORCH_INSTALL_PREFIX}/../../../.." ABSOLUTE)
  string(REGEX MATCH "^[0-9]+\\.[0-9]+" torch_major_minor "${Torch_VERSION}")
  foreach(candidate "${torch_env}/bin/python" ${Python3_EXECUTABLE} /usr/bin/python3)
    if(NOT EXISTS "${candidate}")
      continue()
    endif()
    execute_process(COMMAND ${candidate} -c
                    "import torch.distributed.run, torch; print(torch.__version__)"
                    RESULT_VARIABLE import_failed OUTPUT_VARIABLE candidate_version
                    ERROR_QUIET OUTPUT_STRIP_TRAILING_WHITESPACE)
    if(NOT import_failed AND candidate_version MATCHES "^${torch_major_minor}\\.")
      set(DPTRAIN_TORCHRUN_PYTHON ${candidate})
      break()
    endif()
  endforeach()
endif()
message(STATUS "dptrain: torchrun for tests: ${DPTRAIN_TORCHRUN_PYTHON}")

# ---- cxxopts ----------------------------------------------------------------
# Version 3 or newer: the command line uses its 3.x API (2.x's parse() and exceptions differ).
find_package(cxxopts 3 CONFIG QUIET)
if(NOT TARGET cxxopts::cxxopts)
  message(STATUS "dptrain: cxxopts 3 not installed, fetching v3.1.1")
  FetchContent_Declare(cxxopts
    URL https://github.com/jarro2783/cxxopts/archive/refs/tags/v3.1.1.tar.gz)
  FetchContent_MakeAvailable(cxxopts)
else()
  message(STATUS "dptrain: cxxopts ${cxxopts_VERSION}: ${cxxopts_DIR}")
endif()

# ---- GoogleTest -------------------------------------------------------------
if(BUILD_TESTING)
  find_package(GTest CONFIG QUIET)
  if(NOT TARGET GTest::gtest_main)
    if(FETCHCONTENT_SOURCE_DIR_GOOGLETEST)
      message(STATUS "dptrain: GoogleTest from ${FETCHCONTENT_SOURCE_DIR_GOOGLETEST}")
    else()
      message(STATUS "dptrain: GoogleTest not installed, fetching v1.14.0")
    endif()
    FetchContent_Declare(googletest
      URL https://github.com/google/googletest/archive/refs/tags/v1.14.0.tar.gz)
    set(INSTALL_GTEST OFF CACHE BOOL "" FORCE)
    set(BUILD_GMOCK OFF CACHE BOOL "" FORCE)
    FetchContent_MakeAvailable(googletest)
    if(NOT TARGET GTest::gtest_main)  # GoogleTest before 1.13 defines no namespaced aliases
      add_library(GTest::gtest_main ALIAS gtest_main)
    endif()
  endif()
  include(GoogleTest)
  # libpng: the plot test decodes headless Chromium's PNG screenshots (tests/support/png_check.h).
  # The device build (bench/gpu_check.sh), which has neither Chromium nor libpng, turns it off.
  option(DPTRAIN_PLOT_RENDER_TEST "Build the test that renders the plot in Chromium (libpng)" ON)
  if(DPTRAIN_PLOT_RENDER_TEST)
    find_package(PNG REQUIRED)
  endif()
endif()

# The one place where dptrain finds outside libraries.
# LibTorch: find_package(Torch) -- Debian's 1.13 by default, or a CUDA LibTorch 2.x through
# CMAKE_PREFIX_PATH, whose CUDA toolkit is found first (cuda_toolkit.cmake) and whose NCCL header
# is checked against it after (nccl.cmake). cxxopts (3 or newer) and GoogleTest: Debian's packages, else a pinned
# FetchContent (FETCHCONTENT_SOURCE_DIR_<NAME> points it at local sources: the device kit).
# zlib and OpenSSL's libcrypto (SHA-256): required. libcurl (dptrain download) and Gloo's headers
# (--backend gloo): used when found, see DPTRAIN_DOWNLOAD and DPTRAIN_GLOO; so are protobuf and
# ISA-L (--tensorboard, DPTRAIN_TENSORBOARD). libpng: the plot test
# (DPTRAIN_PLOT_RENDER_TEST). Every search also looks under CMAKE_PREFIX_PATH.
include(FetchContent)

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
set(DPTRAIN_TENSORBOARD AUTO CACHE STRING
    "--tensorboard: AUTO (when protobuf, protoc and ISA-L are found) or OFF")
set_property(CACHE DPTRAIN_GLOO PROPERTY STRINGS AUTO OFF)
set_property(CACHE DPTRAIN_DOWNLOAD PROPERTY STRINGS AUTO OFF)
set_property(CACHE DPTRAIN_TENSORBOARD PROPERTY STRINGS AUTO OFF)
foreach(knob DPTRAIN_GLOO DPTRAIN_DOWNLOAD DPTRAIN_TENSORBOARD)
  if(NOT ${knob} MATCHES "^(AUTO|OFF)$")
    message(FATAL_ERROR "${knob} must be AUTO or OFF, not '${${knob}}'")
  endif()
endforeach()

# dptrain_probe_torch_header(RESULT SOURCE INCLUDES DEFINITIONS): whether SOURCE, which includes
# LibTorch headers, compiles (no link) with the include folders and compile definitions given as
# lists, LibTorch's flags and DPTRAIN_CXX_STANDARD, as dptrain's own sources are compiled. Sets
# RESULT and RESULT_WHY: where it does not compile, the compiler's first "error:" line, which the
# caller's status line quotes so that a user sees why (the whole output is in
# CMakeFiles/dptrain-probes/RESULT.log). Both are cached, keyed on everything the probe depends
# on, so that another LibTorch, header or standard probes again. The Gloo and NCCL probes use it.
function(dptrain_probe_torch_header result source includes definitions)
  string(MD5 key "${source};${includes};${definitions};${TORCH_CXX_FLAGS};${DPTRAIN_CXX_STANDARD}")
  if(DEFINED ${result} AND "${${result}_KEY}" STREQUAL "${key}")
    set(${result}_WHY "${${result}_WHY}" PARENT_SCOPE)
    return()
  endif()
  set(dir "${CMAKE_BINARY_DIR}/CMakeFiles/dptrain-probes")
  file(WRITE "${dir}/${result}.cpp" "${source}")
  separate_arguments(flags UNIX_COMMAND "${TORCH_CXX_FLAGS}")
  foreach(definition IN LISTS definitions)
    list(APPEND flags -D${definition})
  endforeach()
  set(CMAKE_TRY_COMPILE_TARGET_TYPE STATIC_LIBRARY)  # headers only: nothing to link
  try_compile(compiles "${dir}/${result}" SOURCES "${dir}/${result}.cpp"
              CMAKE_FLAGS "-DINCLUDE_DIRECTORIES=${includes}"
              COMPILE_DEFINITIONS ${flags}
              CXX_STANDARD ${DPTRAIN_CXX_STANDARD} CXX_STANDARD_REQUIRED ON
              OUTPUT_VARIABLE output)
  file(WRITE "${dir}/${result}.log" "${output}")
  set(why "")
  if(NOT compiles)
    # "/path/to/header.h:12:3: error: what" -> "header.h:12: what"
    if(output MATCHES "([^\n/ ]+):([0-9]+):[0-9:]* (fatal )?error: ([^\n]*)")
      set(why "${CMAKE_MATCH_1}:${CMAKE_MATCH_2}: ${CMAKE_MATCH_4}")
    else()
      set(why "no error line; the compiler's output is in ${dir}/${result}.log")
    endif()
  endif()
  set(${result} ${compiles} CACHE INTERNAL "dptrain_probe_torch_header")
  set(${result}_KEY "${key}" CACHE INTERNAL "dptrain_probe_torch_header")
  set(${result}_WHY "${why}" CACHE INTERNAL "dptrain_probe_torch_header")
  set(${result}_WHY "${why}" PARENT_SCOPE)
endfunction()

# dptrain_torch_cxx_standard(OUT_STANDARD OUT_REASON): the C++ standard to compile dptrain with:
# the newest that LibTorch's headers demand (their "#if __cplusplus < 202002L / #error C++20 or
# later ..." guards in ATen.h and torch/all.h), and never below 17, dptrain's own. When no such
# guard is found (headers laid out otherwise), LibTorch's version decides: 2.14 and newer require
# C++20 (pytorch/pytorch#178150), older ones C++17. OUT_REASON says which, for the status line.
function(dptrain_torch_cxx_standard out_standard out_reason)
  set(required 0)
  set(where "")
  foreach(dir IN LISTS dptrain_torch_includes)
    foreach(header ATen/ATen.h torch/all.h c10/macros/Macros.h)
      if(NOT EXISTS "${dir}/${header}")
        continue()
      endif()
      # __cplusplus is YYYYMML, and the year's last two digits name the standard (201703L: 17).
      file(STRINGS "${dir}/${header}" guards REGEX "__cplusplus *< *20[0-9][0-9][0-9][0-9]L")
      foreach(guard IN LISTS guards)
        if(guard MATCHES "__cplusplus *< *20([0-9][0-9])[0-9][0-9]L"
           AND CMAKE_MATCH_1 GREATER required)
          set(required ${CMAKE_MATCH_1})
          set(where "${header}")
        endif()
      endforeach()
    endforeach()
  endforeach()
  if(required GREATER 0)
    set(reason "LibTorch ${Torch_VERSION}'s headers require C++${required} (${where})")
  else()
    if(Torch_VERSION VERSION_GREATER_EQUAL 2.14)
      set(required 20)
    else()
      set(required 17)
    endif()
    string(CONCAT reason "no C++ guard found in LibTorch ${Torch_VERSION}'s headers; "
                  "C++${required} from its version")
  endif()
  if(required LESS 17)
    set(reason "dptrain's own minimum; ${reason}")
    set(required 17)
  endif()
  set(${out_standard} ${required} PARENT_SCOPE)
  set(${out_reason} "${reason}" PARENT_SCOPE)
endfunction()

# ---- LibTorch ---------------------------------------------------------------
include(${CMAKE_CURRENT_LIST_DIR}/torch_interface.cmake)
dptrain_prepare_cuda_toolkit()
dptrain_prefer_torch_own_libraries()
find_package(Torch REQUIRED)
if(Torch_VERSION VERSION_LESS 1.13)
  message(FATAL_ERROR "dptrain needs LibTorch 1.13 or newer, found ${Torch_VERSION}")
endif()
get_target_property(dptrain_torch_cpu torch_cpu LOCATION)
get_filename_component(dptrain_torch_cpu_dir "${dptrain_torch_cpu}" DIRECTORY)
get_filename_component(dptrain_torch_cpu_dir "${dptrain_torch_cpu_dir}" REALPATH)
foreach(variable TORCH_LIBRARY c10_LIBRARY)
  get_filename_component(dir "${${variable}}" DIRECTORY)
  get_filename_component(dir "${dir}" REALPATH)
  if(NOT dir STREQUAL dptrain_torch_cpu_dir)
    dptrain_fail("find_package(Torch) took ${variable}=${${variable}} from another LibTorch than "
                 "its own ${dptrain_torch_cpu} (Note [Another LibTorch's libtorch.so] in "
                 "third_party/torch_interface.cmake): pass -D${variable}= the one in "
                 "${dptrain_torch_cpu_dir}, or add that LibTorch's root to CMAKE_PREFIX_PATH")
  endif()
endforeach()
# The headers' include folders, which dptrain_torch_cxx_standard reads.
get_target_property(dptrain_torch_includes torch INTERFACE_INCLUDE_DIRECTORIES)

# The C++ standard of every dptrain target and every header probe, decided here once. Each
# target asks for it with target_compile_features(... cxx_std_${DPTRAIN_CXX_STANDARD}), and
# dptrain_torch carries it too, so that anything compiled against LibTorch's headers gets it.
dptrain_torch_cxx_standard(DPTRAIN_CXX_STANDARD dptrain_cxx_reason)
if(NOT "cxx_std_${DPTRAIN_CXX_STANDARD}" IN_LIST CMAKE_CXX_COMPILE_FEATURES)
  dptrain_fail("${dptrain_cxx_reason}, which ${CMAKE_CXX_COMPILER} (${CMAKE_CXX_COMPILER_ID} "
               "${CMAKE_CXX_COMPILER_VERSION}) does not support: pass -DCMAKE_CXX_COMPILER= a "
               "newer compiler (GCC 10 or Clang 10 and newer know C++20)")
endif()
# LibTorch's libraries, flags and headers for dptrain's own targets (torch_interface.cmake).
add_library(dptrain_torch INTERFACE)
dptrain_torch_interface(dptrain_torch ${DPTRAIN_CXX_STANDARD})

# Which collective backends this LibTorch carries, decided once here (see lib/CMakeLists.txt).
if(TARGET torch_cuda)
  set(DPTRAIN_WITH_CUDA ON)
else()
  set(DPTRAIN_WITH_CUDA OFF)
endif()
message(STATUS "dptrain: LibTorch ${Torch_VERSION} (${TORCH_INSTALL_PREFIX})")
message(STATUS "dptrain: C++ standard: ${DPTRAIN_CXX_STANDARD} (${dptrain_cxx_reason})")
message(STATUS "dptrain: CUDA support: ${DPTRAIN_WITH_CUDA}")
include(${CMAKE_CURRENT_LIST_DIR}/nccl.cmake)

# ---- Gloo headers: --backend gloo ---------------------------------------------------
# PyPI's LibTorch carries Gloo inside but not its headers, which ProcessGroupGloo.hpp includes.
# Headers of another Gloo (Debian's libgloo-dev, the device kit's copy) may not compile against
# this LibTorch's c10d, so AUTO compiles that header once with them and leaves Gloo out, saying
# so, when it fails. Without Gloo, --backend gloo is refused with one line (distributed.cpp).
set(DPTRAIN_WITH_GLOO OFF)
set(dptrain_gloo_why "DPTRAIN_GLOO=OFF")
if(DPTRAIN_GLOO STREQUAL "AUTO")
  find_path(DPTRAIN_GLOO_INCLUDE_DIR gloo/algorithm.h)
  if(NOT DPTRAIN_GLOO_INCLUDE_DIR)
    string(CONCAT dptrain_gloo_why "no Gloo headers (gloo/algorithm.h) found: install them "
                  "(Debian: libgloo-dev) or pass -DDPTRAIN_GLOO_INCLUDE_DIR=DIR")
  else()
    get_target_property(torch_definitions torch_cpu INTERFACE_COMPILE_DEFINITIONS)
    dptrain_probe_torch_header(DPTRAIN_GLOO_COMPILES [[
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#if !defined(USE_C10D_GLOO)
#error "this LibTorch was built without Gloo"
#endif
int dptrain_gloo_probe() { return static_cast<int>(sizeof(c10d::ProcessGroupGloo::Options)); }
]] "${DPTRAIN_GLOO_INCLUDE_DIR};${dptrain_torch_includes}" "${torch_definitions}")
    if(DPTRAIN_GLOO_COMPILES)
      set(DPTRAIN_WITH_GLOO ON)
    else()
      string(CONCAT dptrain_gloo_why
          "ProcessGroupGloo.hpp does not compile as C++${DPTRAIN_CXX_STANDARD} with the Gloo "
          "headers in ${DPTRAIN_GLOO_INCLUDE_DIR}: ${DPTRAIN_GLOO_COMPILES_WHY}")
    endif()
  endif()
endif()
if(DPTRAIN_WITH_GLOO)
  message(STATUS "dptrain: Gloo support (--backend gloo): ON "
                 "(headers: ${DPTRAIN_GLOO_INCLUDE_DIR})")
else()
  message(STATUS "dptrain: Gloo support (--backend gloo): OFF: ${dptrain_gloo_why}")
endif()

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

# ---- protobuf and ISA-L: TensorBoard event files (--tensorboard) ----------------------------
# Optional, like libcurl: protoc and protobuf-lite serialise the events from our own .proto
# (lib/src/report/tensorboard_event.proto), ISA-L's crc32_iscsi checksums the records. Where one
# is missing (the GPU machine's device kit has no apt), dptrain builds without them and refuses
# --tensorboard in one line naming what this build lacked (DPTRAIN_TENSORBOARD_MISSING).
# Debian's libtorch-dev already links Debian's libprotobuf; a PyPI LibTorch keeps its own
# protobuf's symbols hidden (only onnx_torch's are exported), so Debian's links beside it.
set(DPTRAIN_WITH_TENSORBOARD OFF)
set(DPTRAIN_TENSORBOARD_MISSING "DPTRAIN_TENSORBOARD=OFF")
if(DPTRAIN_TENSORBOARD STREQUAL "AUTO")
  # A PyPI LibTorch ships protobuf 3.13's headers and protoc in its own include/ and bin/, and a
  # CMAKE_PREFIX_PATH that names LibTorch's root (quickstart.sh's GPU path, the Dockerfile) put
  # them before the system's: the generated code then met the system's 3.21 headers and did not
  # compile. Protobuf is looked for with such a LibTorch's folders ignored (Debian's LibTorch
  # lives in /usr, beside Debian's protobuf, and is left alone); a cache that took them is
  # looked up again.
  set(dptrain_ignore_path_before "${CMAKE_IGNORE_PATH}")
  if(EXISTS "${TORCH_INSTALL_PREFIX}/include/google/protobuf"
     AND NOT TORCH_INSTALL_PREFIX MATCHES "^/usr/?$")
    list(APPEND CMAKE_IGNORE_PATH "${TORCH_INSTALL_PREFIX}/include" "${TORCH_INSTALL_PREFIX}/bin"
         "${TORCH_INSTALL_PREFIX}/lib")
    foreach(variable Protobuf_INCLUDE_DIR Protobuf_PROTOC_EXECUTABLE)
      string(FIND "${${variable}}" "${TORCH_INSTALL_PREFIX}/" dptrain_in_torch)
      if(dptrain_in_torch EQUAL 0)
        unset(${variable} CACHE)
      endif()
    endforeach()
  endif()
  find_package(Protobuf QUIET)
  set(CMAKE_IGNORE_PATH "${dptrain_ignore_path_before}")
  find_path(DPTRAIN_ISAL_INCLUDE_DIR isa-l/crc.h)
  find_library(DPTRAIN_ISAL_LIBRARY isal)
  set(dptrain_tensorboard_lacks "")
  if(NOT Protobuf_FOUND OR NOT TARGET protobuf::libprotobuf-lite)
    list(APPEND dptrain_tensorboard_lacks "protobuf's headers and library (libprotobuf-dev)")
  endif()
  if(NOT Protobuf_PROTOC_EXECUTABLE)
    list(APPEND dptrain_tensorboard_lacks "the protobuf compiler protoc (protobuf-compiler)")
  elseif(Protobuf_FOUND)
    # The generated code compiles only against the headers of protoc's own version.
    execute_process(COMMAND "${Protobuf_PROTOC_EXECUTABLE}" --version
                    OUTPUT_VARIABLE dptrain_protoc_version ERROR_QUIET
                    OUTPUT_STRIP_TRAILING_WHITESPACE)
    string(REGEX MATCH "[0-9]+\\.[0-9]+" dptrain_protoc_version "${dptrain_protoc_version}")
    string(REGEX MATCH "[0-9]+\\.[0-9]+" dptrain_protobuf_headers "${Protobuf_VERSION}")
    if(NOT dptrain_protoc_version STREQUAL dptrain_protobuf_headers)
      list(APPEND dptrain_tensorboard_lacks
           "a protoc of the headers' version (protoc ${dptrain_protoc_version}, headers "
           "${Protobuf_VERSION})")
    endif()
  endif()
  if(NOT DPTRAIN_ISAL_INCLUDE_DIR OR NOT DPTRAIN_ISAL_LIBRARY)
    list(APPEND dptrain_tensorboard_lacks "ISA-L's CRC-32C (libisal-dev)")
  endif()
  if(dptrain_tensorboard_lacks)
    list(JOIN dptrain_tensorboard_lacks ", " dptrain_tensorboard_lacks)
    set(DPTRAIN_TENSORBOARD_MISSING "no ${dptrain_tensorboard_lacks} found at build time")
  else()
    set(DPTRAIN_WITH_TENSORBOARD ON)
    set(DPTRAIN_TENSORBOARD_MISSING "")
    # Named as the installed package names it (lib/cmake/dptrainDependencies.cmake.in).
    add_library(dptrain::isal UNKNOWN IMPORTED GLOBAL)
    set_target_properties(dptrain::isal PROPERTIES IMPORTED_LOCATION "${DPTRAIN_ISAL_LIBRARY}"
                          INTERFACE_INCLUDE_DIRECTORIES "${DPTRAIN_ISAL_INCLUDE_DIR}")
  endif()
endif()
if(DPTRAIN_WITH_TENSORBOARD)
  message(STATUS "dptrain: TensorBoard event files (--tensorboard): ON (protobuf "
                 "${Protobuf_VERSION}, ISA-L ${DPTRAIN_ISAL_LIBRARY})")
else()
  message(STATUS "dptrain: TensorBoard event files (--tensorboard): OFF: "
                 "${DPTRAIN_TENSORBOARD_MISSING}")
endif()

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

# ---- nlohmann-json ------------------------------------------------------------
# The JSON of safetensors headers and of a checkpoint's run state (core/safetensors.h,
# train/checkpoint.h). Header-only: Debian's nlohmann-json3-dev, else a pinned release.
find_package(nlohmann_json 3.9 CONFIG QUIET)
if(NOT TARGET nlohmann_json::nlohmann_json)
  message(STATUS "dptrain: nlohmann-json 3 not installed, fetching v3.11.2")
  FetchContent_Declare(nlohmann_json
    URL https://github.com/nlohmann/json/releases/download/v3.11.2/json.tar.xz)
  FetchContent_MakeAvailable(nlohmann_json)
else()
  message(STATUS "dptrain: nlohmann-json ${nlohmann_json_VERSION}: ${nlohmann_json_DIR}")
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

# The one place where dptrain finds outside libraries.
# LibTorch: find_package(Torch) -- Debian's 1.13 by default, or a CUDA LibTorch 2.x through
# CMAKE_PREFIX_PATH. cxxopts, GoogleTest and zlib: Debian's packages, else a pinned FetchContent.
# libcurl (dptrain download) and OpenSSL's libcrypto (its SHA-256): the system's, found by
# find_package. libpng (the plot test reads Chromium's screenshots): the system's, tests only.
include(FetchContent)

# ---- LibTorch ---------------------------------------------------------------
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
message(STATUS "dptrain: LibTorch ${Torch_VERSION}, CUDA/NCCL support: ${DPTRAIN_WITH_CUDA}")

# ---- zlib -------------------------------------------------------------------
find_package(ZLIB REQUIRED)

# ---- libcurl: fetching the data set (http, https, file) ----------------------------
find_package(CURL REQUIRED)

# ---- OpenSSL's libcrypto: SHA-256 of the downloaded files (sha256.h) -----------------
find_package(OpenSSL REQUIRED COMPONENTS Crypto)

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
find_package(cxxopts CONFIG QUIET)
if(NOT TARGET cxxopts::cxxopts)
  message(STATUS "dptrain: cxxopts not installed, fetching v3.1.1")
  FetchContent_Declare(cxxopts
    URL https://github.com/jarro2783/cxxopts/archive/refs/tags/v3.1.1.tar.gz)
  FetchContent_MakeAvailable(cxxopts)
endif()

# ---- GoogleTest -------------------------------------------------------------
if(BUILD_TESTING)
  find_package(GTest CONFIG QUIET)
  if(NOT TARGET GTest::gtest_main)
    message(STATUS "dptrain: GoogleTest not installed, fetching v1.14.0")
    FetchContent_Declare(googletest
      URL https://github.com/google/googletest/archive/refs/tags/v1.14.0.tar.gz)
    set(INSTALL_GTEST OFF CACHE BOOL "" FORCE)
    FetchContent_MakeAvailable(googletest)
  endif()
  include(GoogleTest)
  # libpng: the plot test decodes headless Chromium's PNG screenshots (tests/png_check.h).
  find_package(PNG REQUIRED)
endif()

# After find_package(Torch): NCCL's header for --backend nccl, when this LibTorch has
# ProcessGroupNCCL (a CUDA LibTorch 2.x). Sets DPTRAIN_WITH_NCCL and DPTRAIN_NCCL_INCLUDE_DIR.
# Not here: the CUDA toolkit (third_party/cuda_toolkit.cmake).
#
# Note [nccl.h must be the NCCL LibTorch was built with]
# ProcessGroupNCCL.hpp includes <nccl.h> (through NCCLUtils.hpp), and NCCLUtils.hpp changes the
# members of ProcessGroupNCCL::Options with NCCL_VERSION_CODE (the NCCL_HAS_* switches). dptrain
# creates those Options in its own translation unit (distributed.cpp) and hands them to
# libtorch_cuda.so, so a header of another NCCL version compiles and then writes fields that are
# not where LibTorch reads them: silent heap corruption. So the header is looked for beside the
# NCCL that LibTorch loads (PyPI: site-packages/nvidia/nccl/include) before anywhere else, its
# version is compared with the one LibTorch was built with (the wheel's pin on nvidia-nccl-cu*),
# and a mismatch stops the configure in one line. No header at all, or one that does not compile
# against this ProcessGroupNCCL.hpp, leaves NCCL out (DPTRAIN_NCCL=AUTO, saying so): dptrain
# then refuses --backend nccl at run time in one line (distributed.cpp).

set(DPTRAIN_NCCL AUTO CACHE STRING
    "--backend nccl: AUTO (when this LibTorch has NCCL and nccl.h of its version compiles) or OFF")
set_property(CACHE DPTRAIN_NCCL PROPERTY STRINGS AUTO OFF)
if(NOT DPTRAIN_NCCL MATCHES "^(AUTO|OFF)$")
  message(FATAL_ERROR "DPTRAIN_NCCL must be AUTO or OFF, not '${DPTRAIN_NCCL}'")
endif()
set(DPTRAIN_NCCL_INCLUDE_DIR "" CACHE PATH "Folder of the nccl.h to build --backend nccl with")

# dptrain_torch_nccl_version(OUT_VERSION OUT_SOURCE): the NCCL version this LibTorch was built
# with, and where that was read: the wheel's pin on nvidia-nccl-cu* (its METADATA), else the
# header that ships beside the libnccl.so.2 it loads; empty when neither is there (a LibTorch
# zip that links NCCL statically).
function(dptrain_torch_nccl_version out_version out_source)
  get_filename_component(site "${TORCH_INSTALL_PREFIX}/.." ABSOLUTE)
  file(GLOB metadata "${site}/torch-*.dist-info/METADATA")
  foreach(file IN LISTS metadata)
    file(STRINGS "${file}" pins REGEX "^Requires-Dist: nvidia-nccl-cu[0-9]+ *==")
    foreach(pin IN LISTS pins)
      if(pin MATCHES "== *([0-9]+\\.[0-9]+\\.[0-9]+)")
        set(${out_version} "${CMAKE_MATCH_1}" PARENT_SCOPE)
        set(${out_source} "${file}" PARENT_SCOPE)
        return()
      endif()
    endforeach()
  endforeach()
  dptrain_header_version(version "${site}/nvidia/nccl/include/nccl.h" NCCL)
  if(version)
    set(${out_version} "${version}" PARENT_SCOPE)
    set(${out_source} "${site}/nvidia/nccl/include/nccl.h" PARENT_SCOPE)
    return()
  endif()
  set(${out_version} "" PARENT_SCOPE)
  set(${out_source} "" PARENT_SCOPE)
endfunction()

set(DPTRAIN_WITH_NCCL OFF)
set(dptrain_nccl_why "")
set(dptrain_torch_cuda_definitions "")
if(TARGET torch_cuda)
  get_target_property(dptrain_torch_cuda_definitions torch_cuda INTERFACE_COMPILE_DEFINITIONS)
endif()
if(DPTRAIN_NCCL STREQUAL "OFF")
  set(dptrain_nccl_why "DPTRAIN_NCCL=OFF")
elseif(NOT DPTRAIN_WITH_CUDA)
  set(dptrain_nccl_why "this LibTorch has no CUDA")
elseif(Torch_VERSION VERSION_LESS 2.0 OR NOT "USE_C10D_NCCL" IN_LIST dptrain_torch_cuda_definitions)
  set(dptrain_nccl_why "this LibTorch has no ProcessGroupNCCL (needs 2.x built with NCCL)")
else()
  dptrain_torch_nccl_version(dptrain_nccl_expected dptrain_nccl_expected_from)
  get_filename_component(dptrain_site "${TORCH_INSTALL_PREFIX}/.." ABSOLUTE)
  # Beside LibTorch's own NCCL first; then what the user named; then the toolkit and the system.
  set(dptrain_nccl_header "")
  foreach(dir "${DPTRAIN_NCCL_INCLUDE_DIR}" "${dptrain_site}/nvidia/nccl/include"
          "$ENV{NCCL_ROOT}/include" "$ENV{NCCL_HOME}/include" ${CUDAToolkit_INCLUDE_DIRS}
          /usr/local/include /usr/include)
    if(NOT dir STREQUAL "" AND NOT dir STREQUAL "/include" AND EXISTS "${dir}/nccl.h")
      get_filename_component(dptrain_nccl_header "${dir}" REALPATH)
      break()
    endif()
    if(DPTRAIN_NCCL_INCLUDE_DIR AND dir STREQUAL "${DPTRAIN_NCCL_INCLUDE_DIR}")
      dptrain_fail("DPTRAIN_NCCL_INCLUDE_DIR=${dir} has no nccl.h")
    endif()
  endforeach()
  if(NOT dptrain_nccl_header)
    string(CONCAT dptrain_nccl_why
        "no nccl.h beside LibTorch (${dptrain_site}/nvidia/nccl/include), in "
        "the CUDA toolkit or the system: install nvidia-nccl-cu13==${dptrain_nccl_expected} or "
        "pass -DDPTRAIN_NCCL_INCLUDE_DIR=DIR")
  else()
    dptrain_header_version(dptrain_nccl_found "${dptrain_nccl_header}/nccl.h" NCCL)
    if(dptrain_nccl_expected AND NOT dptrain_nccl_found VERSION_EQUAL dptrain_nccl_expected)
      dptrain_fail("${dptrain_nccl_header}/nccl.h is NCCL ${dptrain_nccl_found} "
              "but this LibTorch was built with NCCL ${dptrain_nccl_expected} "
              "(${dptrain_nccl_expected_from}): another version's header would corrupt "
              "ProcessGroupNCCL::Options (third_party/nccl.cmake): pass "
              "-DDPTRAIN_NCCL_INCLUDE_DIR=DIR of NCCL ${dptrain_nccl_expected}'s headers, or "
              "-DDPTRAIN_NCCL=OFF to build without NCCL")
    endif()
    if(NOT dptrain_nccl_expected)
      string(CONCAT dptrain_nccl_why
          "the NCCL version this LibTorch was built with is unknown (no "
          "nvidia-nccl pin, no nccl.h beside it), so ${dptrain_nccl_header}/nccl.h "
          "(${dptrain_nccl_found}) cannot be checked against it")
    else()
      # The probe: ProcessGroupNCCL.hpp with this header, as distributed.cpp compiles it (the
      # torch targets' includes and definitions by hand: try_compile cannot import them whole).
      # Its folder comes first, as in lib/CMakeLists.txt: a toolkit may carry another nccl.h.
      get_target_property(dptrain_torch_cpu_definitions torch_cpu INTERFACE_COMPILE_DEFINITIONS)
      # One cached answer per header and version, so that pointing at another header probes again.
      string(MD5 dptrain_nccl_key "${dptrain_nccl_header};${dptrain_nccl_found};${Torch_VERSION}")
      string(SUBSTRING "${dptrain_nccl_key}" 0 12 dptrain_nccl_key)
      dptrain_probe_torch_header(DPTRAIN_NCCL_COMPILES_${dptrain_nccl_key} [[
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#if !defined(USE_C10D_NCCL)
#error "this LibTorch was built without NCCL"
#endif
int dptrain_nccl_probe() {
  return static_cast<int>(sizeof(c10d::ProcessGroupNCCL::Options)) + NCCL_VERSION_CODE;
}
]] "${dptrain_nccl_header};${dptrain_torch_includes};${CUDAToolkit_INCLUDE_DIRS}"
        "${dptrain_torch_cpu_definitions};${dptrain_torch_cuda_definitions}")
      set(DPTRAIN_NCCL_COMPILES ${DPTRAIN_NCCL_COMPILES_${dptrain_nccl_key}})
      if(DPTRAIN_NCCL_COMPILES)
        set(DPTRAIN_WITH_NCCL ON)
        set(DPTRAIN_NCCL_FOUND_VERSION "${dptrain_nccl_found}")
        set(DPTRAIN_NCCL_HEADER_DIR "${dptrain_nccl_header}")
      else()
        string(CONCAT dptrain_nccl_why
            "ProcessGroupNCCL.hpp does not compile as C++${DPTRAIN_CXX_STANDARD} with nccl.h from "
            "${dptrain_nccl_header}: ${DPTRAIN_NCCL_COMPILES_${dptrain_nccl_key}_WHY}")
      endif()
    endif()
  endif()
endif()
if(DPTRAIN_WITH_NCCL)
  message(STATUS "dptrain: NCCL support (--backend nccl): ON, NCCL ${DPTRAIN_NCCL_FOUND_VERSION} "
                 "(${DPTRAIN_NCCL_HEADER_DIR}; LibTorch's: ${dptrain_nccl_expected_from})")
else()
  message(STATUS "dptrain: NCCL support (--backend nccl): OFF: ${dptrain_nccl_why}")
endif()

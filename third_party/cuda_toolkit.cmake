# Before find_package(Torch): when the LibTorch about to be found is a CUDA build, find the CUDA
# toolkit it will configure against and tell its CMake where that is, or stop in one line that
# says what is missing where. Not here: NCCL (third_party/nccl.cmake), and anything for a CPU
# LibTorch (Debian's 1.13), which this file leaves alone.
#
# Note [A CUDA LibTorch's configure and the toolkit]
# A CUDA LibTorch's Caffe2Config.cmake runs public/cuda.cmake: the legacy FindCUDA (nvcc, cuda.h,
# an unversioned libcudart.so), then find_package(CUDAToolkit REQUIRED), which needs unversioned
# libcudart.so, libnvrtc.so and a libcuda.so (the driver or the toolkit's stubs/libcuda.so) for
# the imported targets that torch::cudart names. When one is missing, FindCUDA fails quietly and
# Caffe2Config stops with "cannot find the CUDA libraries" naming none of them. A toolkit put
# together from PyPI's nvidia-* wheels (GPU images often are) has only libcudart.so.13 and the
# like, and no stubs. So: find nvcc (CMAKE_CUDA_COMPILER, CUDAToolkit_ROOT, CUDA_HOME, PATH,
# /usr/local/cuda, the wheels beside torch), take its root, check every library above, and where
# only a versioned file exists link the unversioned name to it in the build tree and put that
# folder on CMAKE_LIBRARY_PATH. cuDNN is not needed to configure (a LibTorch 2.x consumer builds
# without it) but is reported: libtorch_cuda.so loads it at run time, from the wheel beside it
# where there is one.

# dptrain_locate_torch_config(OUT): the folder of the TorchConfig.cmake that find_package(Torch)
# would take, looking where it looks (Torch_DIR, then CMAKE_PREFIX_PATH); empty when not found
# this way (find_package then searches the system on its own: Debian's CPU LibTorch).
function(dptrain_locate_torch_config out)
  set(found "")
  set(candidates "")
  if(Torch_DIR)
    list(APPEND candidates "${Torch_DIR}")
  endif()
  foreach(prefix IN LISTS CMAKE_PREFIX_PATH)
    list(APPEND candidates "${prefix}" "${prefix}/Torch" "${prefix}/share/cmake/Torch"
         "${prefix}/lib/cmake/Torch" "${prefix}/lib/x86_64-linux-gnu/cmake/Torch")
  endforeach()
  foreach(dir IN LISTS candidates)
    if(EXISTS "${dir}/TorchConfig.cmake")
      get_filename_component(found "${dir}" REALPATH)
      break()
    endif()
  endforeach()
  set(${out} "${found}" PARENT_SCOPE)
endfunction()

# dptrain_header_version(OUT FILE PREFIX): "MAJOR.MINOR.PATCH" from the #defines PREFIX_MAJOR,
# PREFIX_MINOR and PREFIX_PATCH (or PREFIX_PATCHLEVEL) of FILE; empty when they are not there.
function(dptrain_header_version out file prefix)
  set(version "")
  if(EXISTS "${file}")
    file(STRINGS "${file}" lines REGEX "^#define ${prefix}_(MAJOR|MINOR|PATCH|PATCHLEVEL) +[0-9]+")
    foreach(part MAJOR MINOR PATCH)
      set(value "")
      foreach(line IN LISTS lines)
        if(line MATCHES "^#define ${prefix}_${part}(LEVEL)? +([0-9]+)")
          set(value "${CMAKE_MATCH_2}")
        endif()
      endforeach()
      if(value STREQUAL "")
        set(${out} "" PARENT_SCOPE)
        return()
      endif()
      list(APPEND numbers "${value}")
    endforeach()
    list(JOIN numbers "." version)
  endif()
  set(${out} "${version}" PARENT_SCOPE)
endfunction()

# dptrain_find_cuda_library(OUT NAME DIRS...): the path of libNAME.so in the first of DIRS that
# has it unversioned, else of its newest versioned file (libNAME.so.13); empty when none has it.
function(dptrain_find_cuda_library out name)
  set(found "")
  foreach(dir IN LISTS ARGN)
    if(EXISTS "${dir}/lib${name}.so")
      set(found "${dir}/lib${name}.so")
      break()
    endif()
    file(GLOB versioned "${dir}/lib${name}.so.[0-9]*")
    if(versioned)
      list(SORT versioned COMPARE NATURAL ORDER DESCENDING)
      list(GET versioned 0 found)
      break()
    endif()
  endforeach()
  set(${out} "${found}" PARENT_SCOPE)
endfunction()

function(dptrain_prepare_cuda_toolkit)
  dptrain_locate_torch_config(torch_config)
  if(NOT torch_config OR NOT EXISTS "${torch_config}/../Caffe2/Caffe2Config.cmake")
    return()
  endif()
  # "set(CAFFE2_USE_CUDA ON)" up to 2.11, "set(CAFFE2_USE_CUDA 1)" in 2.15.
  file(STRINGS "${torch_config}/../Caffe2/Caffe2Config.cmake" cuda_build
       REGEX "^ *set\\(CAFFE2_USE_CUDA (ON|1|TRUE)\\)")
  if(NOT cuda_build)
    return()  # a CPU LibTorch: no toolkit needed
  endif()
  # A PyPI wheel: torch/share/cmake/Torch; its site-packages holds the nvidia-* wheels.
  get_filename_component(torch_root "${torch_config}/../../.." ABSOLUTE)
  get_filename_component(site "${torch_root}/.." ABSOLUTE)
  set(wheel_dirs "")
  foreach(part cu13 cu12 cuda_runtime cuda_nvcc cuda_nvrtc cublas)
    if(IS_DIRECTORY "${site}/nvidia/${part}")
      list(APPEND wheel_dirs "${site}/nvidia/${part}")
    endif()
  endforeach()

  # ---- nvcc: the first that is named or found ----
  set(looked "")
  set(nvcc "")
  if(CMAKE_CUDA_COMPILER)
    set(nvcc "${CMAKE_CUDA_COMPILER}")
    set(looked "CMAKE_CUDA_COMPILER=${CMAKE_CUDA_COMPILER}")
    if(NOT EXISTS "${nvcc}")
      dptrain_fail("CMAKE_CUDA_COMPILER=${nvcc} does not exist")
    endif()
  else()
    set(roots "")
    foreach(root "${CUDAToolkit_ROOT}" "$ENV{CUDAToolkit_ROOT}" "$ENV{CUDA_HOME}" "$ENV{CUDA_PATH}")
      if(root)
        list(APPEND roots "${root}")
      endif()
    endforeach()
    find_program(nvcc_on_path nvcc NO_CACHE)
    if(nvcc_on_path)
      get_filename_component(nvcc_on_path "${nvcc_on_path}" REALPATH)
      get_filename_component(root "${nvcc_on_path}/../.." ABSOLUTE)
      list(APPEND roots "${root}")
    endif()
    list(APPEND roots /usr/local/cuda ${wheel_dirs})
    foreach(root IN LISTS roots)
      list(APPEND looked "${root}/bin/nvcc")
      if(EXISTS "${root}/bin/nvcc")
        set(nvcc "${root}/bin/nvcc")
        break()
      endif()
    endforeach()
    if(CUDAToolkit_ROOT AND NOT nvcc STREQUAL "${CUDAToolkit_ROOT}/bin/nvcc")
      dptrain_fail("CUDAToolkit_ROOT=${CUDAToolkit_ROOT} has no bin/nvcc")
    endif()
  endif()
  if(NOT nvcc)
    list(JOIN looked ", " looked)
    dptrain_fail("${torch_root} is a CUDA LibTorch and no nvcc was found "
            "(looked at ${looked}): install the CUDA toolkit or pass -DCUDAToolkit_ROOT=DIR")
  endif()
  get_filename_component(nvcc "${nvcc}" REALPATH)
  get_filename_component(toolkit "${nvcc}/../.." ABSOLUTE)
  execute_process(COMMAND "${nvcc}" --version OUTPUT_VARIABLE nvcc_says ERROR_QUIET)
  string(REGEX MATCH "release [0-9]+\\.[0-9]+" nvcc_release "${nvcc_says}")

  # ---- The headers and libraries that LibTorch's CUDA configure needs ----
  set(include_dirs "${toolkit}/include" "${toolkit}/targets/x86_64-linux/include")
  set(lib_dirs "${toolkit}/lib64" "${toolkit}/lib" "${toolkit}/targets/x86_64-linux/lib")
  foreach(dir IN LISTS wheel_dirs)
    list(APPEND include_dirs "${dir}/include")
    list(APPEND lib_dirs "${dir}/lib")
  endforeach()
  set(cuda_h "")
  foreach(dir IN LISTS include_dirs)
    if(EXISTS "${dir}/cuda_runtime_api.h")
      set(cuda_h "${dir}")
      break()
    endif()
  endforeach()
  if(NOT cuda_h)
    dptrain_fail("the CUDA toolkit at ${toolkit} (from ${nvcc}) has no "
            "cuda_runtime_api.h in include/ or targets/x86_64-linux/include/: pass "
            "-DCUDAToolkit_ROOT=DIR of a complete toolkit")
  endif()
  # The driver: the toolkit's stubs (enough to link) or the installed driver itself; LIBRARY_PATH
  # is where a user points the linker at stubs of their own.
  string(REPLACE ":" ";" library_path "$ENV{LIBRARY_PATH}")
  set(driver_dirs "${toolkit}/lib64/stubs" "${toolkit}/lib/stubs"
      "${toolkit}/targets/x86_64-linux/lib/stubs" /usr/lib/x86_64-linux-gnu /usr/local/nvidia/lib64
      /usr/lib64 ${library_path})
  set(link_dir "${CMAKE_BINARY_DIR}/dptrain-cuda-links")
  set(taken "")
  set(linked OFF)
  foreach(name cudart nvrtc cublas cublasLt cuda)
    if(name STREQUAL "cuda")
      dptrain_find_cuda_library(path cuda ${driver_dirs})
    else()
      dptrain_find_cuda_library(path ${name} ${lib_dirs})
    endif()
    if(NOT path)
      if(name STREQUAL "cuda")
        list(JOIN driver_dirs ", " where)
      else()
        list(JOIN lib_dirs ", " where)
      endif()
      dptrain_fail("no lib${name}.so for the CUDA toolkit at ${toolkit} "
              "(looked in ${where}): install it or pass -DCUDAToolkit_ROOT=DIR")
    endif()
    if(NOT path MATCHES "\\.so$")
      # Only a versioned file (wheels, a driver's libcuda.so.1): the unversioned name, linked.
      file(MAKE_DIRECTORY "${link_dir}")
      file(CREATE_LINK "${path}" "${link_dir}/lib${name}.so" SYMBOLIC)
      set(linked ON)
    endif()
    list(APPEND taken "lib${name}: ${path}")
  endforeach()
  if(linked)
    list(APPEND CMAKE_LIBRARY_PATH "${link_dir}")
    set(CMAKE_LIBRARY_PATH "${CMAKE_LIBRARY_PATH}" PARENT_SCOPE)
    message(STATUS "dptrain: CUDA: unversioned library names linked in ${link_dir}")
  endif()

  # ---- What LibTorch loads at run time: cuDNN beside it first ----
  set(cudnn_version "")
  foreach(dir "${site}/nvidia/cudnn/include" ${include_dirs})
    dptrain_header_version(cudnn_version "${dir}/cudnn_version.h" CUDNN)
    if(cudnn_version)
      set(cudnn_version "${cudnn_version} (${dir})")
      break()
    endif()
  endforeach()
  if(NOT cudnn_version)
    set(cudnn_version "none found: libtorch_cuda.so must find libcudnn.so.9 at run time")
  endif()

  set(CUDAToolkit_ROOT "${toolkit}" CACHE PATH "The CUDA toolkit (dptrain: the root of nvcc)" FORCE)
  set(CUDA_TOOLKIT_ROOT_DIR "${toolkit}" CACHE PATH "The CUDA toolkit, for LibTorch's FindCUDA"
      FORCE)
  set(CMAKE_CUDA_COMPILER "${nvcc}" CACHE FILEPATH "nvcc" FORCE)
  message(STATUS "dptrain: CUDA: nvcc ${nvcc} (${nvcc_release}); headers ${cuda_h}")
  foreach(line IN LISTS taken)
    message(STATUS "dptrain: CUDA: ${line}")
  endforeach()
  message(STATUS "dptrain: CUDA: cuDNN ${cudnn_version}")
endfunction()

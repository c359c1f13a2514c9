# What a target compiled against LibTorch needs, in one place for both of its users: dptrain's
# own build (dependencies.cmake's dptrain_torch) and the installed package (dptrain::torch,
# created by lib/cmake/dptrainDependencies.cmake.in in the project that finds dptrain). Both
# install this file and cuda_toolkit.cmake beside dptrainConfig.cmake.
# Not here: which LibTorch is found or how its version and C++ standard are checked
# (dependencies.cmake), the CUDA toolkit a CUDA LibTorch configures against (cuda_toolkit.cmake).
include(${CMAKE_CURRENT_LIST_DIR}/cuda_toolkit.cmake)

# dptrain_prefer_torch_own_libraries(): before find_package(Torch), points TORCH_LIBRARY and its
# siblings at the lib/ beside the TorchConfig.cmake about to be found, where there is one.
# Note [Another LibTorch's libtorch.so]
# TorchConfig.cmake finds libtorch.so, libc10.so and a few more with find_library(... PATHS
# <its own lib>), and find_library looks in the system folders before PATHS. So with Debian's
# libtorch-dev installed and only torch.utils.cmake_prefix_path given (as PyTorch documents),
# PyPI's LibTorch takes Debian's libtorch.so.1.13 and libc10.so, and the binary loads two
# LibTorch versions at once. Where the TorchConfig.cmake about to be found has its own lib/, those
# names are pointed there first; dependencies.cmake's check after find_package stops any other
# mismatch.
function(dptrain_prefer_torch_own_libraries)
  dptrain_locate_torch_config(torch_config)
  if(NOT torch_config)
    return()
  endif()
  get_filename_component(torch_lib "${torch_config}/../../../lib" ABSOLUTE)
  # TorchConfig.cmake finds its Caffe2Config.cmake with find_package(Caffe2 PATHS <beside it>),
  # which takes the system's (Debian's 1.13) first when only Torch_DIR points at another LibTorch.
  if(EXISTS "${torch_config}/../Caffe2/Caffe2Config.cmake")
    get_filename_component(caffe2_config "${torch_config}/../Caffe2" ABSOLUTE)
    set(Caffe2_DIR "${caffe2_config}" CACHE PATH
        "LibTorch's Caffe2Config.cmake (dptrain: the one beside its TorchConfig.cmake)" FORCE)
  endif()
  foreach(pair TORCH_LIBRARY:torch c10_LIBRARY:c10 C10_CUDA_LIBRARY:c10_cuda
          CAFFE2_NVRTC_LIBRARY:caffe2_nvrtc kineto_LIBRARY:kineto)
    string(REPLACE ":" ";" pair "${pair}")
    list(GET pair 0 variable)
    list(GET pair 1 name)
    set(file "${torch_lib}/lib${name}.so")
    if(EXISTS "${file}" AND NOT "${${variable}}" STREQUAL "${file}")
      set(${variable} "${file}" CACHE FILEPATH
          "LibTorch's lib${name}.so (dptrain: the one beside its TorchConfig.cmake)" FORCE)
    endif()
  endforeach()
endfunction()

# dptrain_torch_interface(TARGET STANDARD): after find_package(Torch), gives the INTERFACE target
# TARGET what compiling and linking against this LibTorch takes: its libraries, TORCH_CXX_FLAGS
# (the C++ ABI switch) instead of an edit of the global flags, its headers as system headers
# (their warnings are not ours), C++ STANDARD, and the nvidia-* wheels beside a PyPI LibTorch
# first on the linker's -rpath-link.
function(dptrain_torch_interface target standard)
  target_link_libraries(${target} INTERFACE ${TORCH_LIBRARIES})
  separate_arguments(flags UNIX_COMMAND "${TORCH_CXX_FLAGS}")
  target_compile_options(${target} INTERFACE ${flags})
  get_target_property(includes torch INTERFACE_INCLUDE_DIRECTORIES)
  if(includes)
    target_include_directories(${target} SYSTEM INTERFACE ${includes})
  endif()
  target_compile_features(${target} INTERFACE cxx_std_${standard})
  # A PyPI LibTorch's libtorch_cuda.so finds libnccl.so.2, cuDNN and the like in the nvidia-*
  # wheels beside it ($ORIGIN/../../nvidia/*/lib). The linker, checking those libraries' symbols,
  # looks in the -rpath folders first, so a CUDA toolkit with another NCCL merged in gave an
  # older libnccl.so.2 ("undefined reference to `ncclCommGrow'" with 2.15); -rpath-link puts the
  # wheels first, as at run time. It changes only where the linker looks, nothing in the binary.
  get_filename_component(site "${TORCH_INSTALL_PREFIX}/.." ABSOLUTE)
  file(GLOB wheel_libs LIST_DIRECTORIES true "${site}/nvidia/*/lib")
  if(wheel_libs)
    list(JOIN wheel_libs ":" wheel_libs)
    target_link_options(${target} INTERFACE "LINKER:-rpath-link,${wheel_libs}")
  endif()
endfunction()

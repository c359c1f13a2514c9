# `cmake --install build --prefix P`: the public headers, the layers' static libraries and the
# CMake package that finds them, P/lib/cmake/dptrain/dptrainConfig.cmake, exporting
# dptrain::dptrain (docs/library.md). Included by lib/CMakeLists.txt when DPTRAIN_INSTALL.
# Not here: what the package finds in the project that uses it (cmake/dptrainDependencies.cmake.in).
include(CMakePackageConfigHelpers)

set(dptrain_package_dir ${CMAKE_INSTALL_LIBDIR}/cmake/dptrain)

# Every header of lib/include/dptrain, the .def tables they include among them. A component of
# their own, so that tests/app_includes_check.py installs them alone to see what is public.
install(DIRECTORY include/dptrain DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        COMPONENT dptrain_headers FILES_MATCHING PATTERN "*.h" PATTERN "*.def")

# The layers, the TensorBoard pieces that dptrain_report links, and dptrain_sanitizers (empty
# unless DPTRAIN_SANITIZE: then a sanitized library's users link the sanitizers' runtime too).
set(dptrain_installed_targets dptrain dptrain_core dptrain_data dptrain_parallel dptrain_model
    dptrain_train dptrain_report dptrain_sanitizers)
if(DPTRAIN_WITH_TENSORBOARD)
  list(APPEND dptrain_installed_targets dptrain_tensorboard_proto dptrain_tensorboard_events)
endif()
set_target_properties(dptrain_sanitizers PROPERTIES EXPORT_NAME sanitizers)
if(DPTRAIN_WITH_TENSORBOARD)
  set_target_properties(dptrain_tensorboard_proto PROPERTIES EXPORT_NAME tensorboard_proto)
  set_target_properties(dptrain_tensorboard_events PROPERTIES EXPORT_NAME tensorboard_events)
endif()
install(TARGETS ${dptrain_installed_targets} EXPORT dptrainTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dptrain_libraries)
install(EXPORT dptrainTargets NAMESPACE dptrain:: DESTINATION ${dptrain_package_dir}
        COMPONENT dptrain_libraries)

# What dptrain was built with, which the package requires of its user's build: the same LibTorch
# major.minor (the static libraries are compiled against its headers and ABI), the same C++
# standard, and the optional pieces' libraries that were linked.
set(DPTRAIN_PACKAGE_TORCH_VERSION ${Torch_VERSION})
configure_package_config_file(cmake/dptrainConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/dptrainConfig.cmake INSTALL_DESTINATION ${dptrain_package_dir})
configure_file(cmake/dptrainDependencies.cmake.in
               ${CMAKE_CURRENT_BINARY_DIR}/dptrainDependencies.cmake @ONLY)
# SameMinorVersion: a 0.x release promises nothing across minor versions, so 0.1 serves 0.1.
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/dptrainConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/dptrainConfig.cmake
              ${CMAKE_CURRENT_BINARY_DIR}/dptrainConfigVersion.cmake
              ${CMAKE_CURRENT_BINARY_DIR}/dptrainDependencies.cmake
              ${PROJECT_SOURCE_DIR}/third_party/torch_interface.cmake
              ${PROJECT_SOURCE_DIR}/third_party/cuda_toolkit.cmake
        DESTINATION ${dptrain_package_dir} COMPONENT dptrain_libraries)

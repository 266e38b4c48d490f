# cmake --install: the libraries a loop of your own links (format, probe,
# core, models, replay), their headers, the programs, and a CMake package config
# so that find_package(nanscope CONFIG REQUIRED) gives nanscope::format,
# nanscope::probe, nanscope::core, nanscope::models and nanscope::replay with their LibTorch,
# HDF5 and CLI11 dependencies.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(NANSCOPE_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/nanscope)
install(TARGETS nanscope_torch nanscope_common nanscope_common_torch nanscope_format nanscope_probe nanscope_core_options nanscope_core nanscope_models_options nanscope_models nanscope_replay
        EXPORT nanscopeTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(DIRECTORY common/include/ format/include/ probe/include/ core/include/ samples/models/include/ replay/include/
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT nanscopeTargets NAMESPACE nanscope:: DESTINATION ${NANSCOPE_CMAKE_DIR})

configure_package_config_file(cmake/nanscopeConfig.cmake.in ${CMAKE_CURRENT_BINARY_DIR}/nanscopeConfig.cmake
                              INSTALL_DESTINATION ${NANSCOPE_CMAKE_DIR})
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/nanscopeConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/nanscopeConfig.cmake ${CMAKE_CURRENT_BINARY_DIR}/nanscopeConfigVersion.cmake
        DESTINATION ${NANSCOPE_CMAKE_DIR})

install(TARGETS nanscope-train nanscope-replay nanscope-report RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
if(TARGET nanscope-view)
  install(TARGETS nanscope-view RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()
# Every page of docs/ (README.md links them) beside the README.
file(GLOB nanscope_docs ${PROJECT_SOURCE_DIR}/docs/*.md)
install(FILES ${nanscope_docs} README.md DESTINATION ${CMAKE_INSTALL_DOCDIR})

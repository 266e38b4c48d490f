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
# Of core's headers, those a loop of yours includes: the guard and its
# options, state and results; the models it trains; an averager, an optimizer
# or a model interface of your own; the doom search after a run. The rest
# (the step's arithmetic, the guard's memories, the journal) are the guard's
# inside, which nanscope's own programs build against from the source tree.
set(NANSCOPE_PUBLIC_CORE_HEADERS
    step_guard.hpp guard_errors.hpp guard_options.hpp guard_state.hpp guarded_model.hpp guarded_step.hpp
    step_outcome.hpp loss_closure.hpp other_model.hpp scoped_autocast.hpp step_setup.hpp fallback_mode.hpp
    precision.hpp rollback.hpp sentinel.hpp model.hpp module_model.hpp closure_model.hpp native_model.hpp
    checkpoint.hpp state_health.hpp gradient_averager.hpp closure_optimizer.hpp optimizer.hpp doom_after_run.hpp
    doom_search.hpp step_history.hpp)
# The list is closed: a public header (and nanscope.hpp, which includes the
# usual ones at once) includes no core header left out.
foreach(header IN LISTS NANSCOPE_PUBLIC_CORE_HEADERS ITEMS ../nanscope.hpp)
  file(STRINGS core/include/nanscope/core/${header} includes REGEX "#include \"nanscope/core/")
  foreach(line IN LISTS includes)
    string(REGEX REPLACE ".*nanscope/core/([^\"]+)\".*" "\\1" included "${line}")
    if(NOT included IN_LIST NANSCOPE_PUBLIC_CORE_HEADERS)
      message(FATAL_ERROR "core/include/nanscope/core/${header} includes ${included}, which is not installed "
                          "(cmake/Install.cmake, NANSCOPE_PUBLIC_CORE_HEADERS)")
    endif()
  endforeach()
endforeach()
list(TRANSFORM NANSCOPE_PUBLIC_CORE_HEADERS PREPEND core/include/nanscope/core/)

# The other libraries' headers that are installed: those the public ones
# include, directly or through others (a loop of yours includes nanscope.hpp,
# the replay's and the sample models' headers; it catches format::FormatError),
# and no more: the probe's capture, the file readers' insides, torch_compat.hpp
# and the command-line helpers stay in the source tree.
set(_nanscope_include_roots common common/include format format/include probe probe/include replay replay/include
    models samples/models/include core core/include)
file(GLOB _nanscope_replay_headers RELATIVE ${PROJECT_SOURCE_DIR} replay/include/nanscope/replay/*.hpp)
file(GLOB _nanscope_model_headers RELATIVE ${PROJECT_SOURCE_DIR} samples/models/include/nanscope/models/*.hpp)
set(_nanscope_to_visit ${NANSCOPE_PUBLIC_CORE_HEADERS} core/include/nanscope/nanscope.hpp ${_nanscope_replay_headers}
    ${_nanscope_model_headers} format/include/nanscope/format/error.hpp)
set(_nanscope_installed_headers "")
while(_nanscope_to_visit)
  list(POP_FRONT _nanscope_to_visit header)
  if(header IN_LIST _nanscope_installed_headers)
    continue()
  endif()
  list(APPEND _nanscope_installed_headers ${header})
  file(STRINGS ${PROJECT_SOURCE_DIR}/${header} includes REGEX "^#include \"nanscope/")
  foreach(line IN LISTS includes)
    string(REGEX REPLACE "^#include \"(nanscope/[^\"]+)\".*" "\\1" included "${line}")
    if(included STREQUAL "nanscope/nanscope.hpp")
      list(APPEND _nanscope_to_visit core/include/nanscope/nanscope.hpp)
      continue()
    endif()
    string(REGEX REPLACE "^nanscope/([^/]+)/.*" "\\1" library "${included}")
    list(FIND _nanscope_include_roots ${library} at)
    if(at LESS 0)
      message(FATAL_ERROR "${header} includes ${included}, whose library has no include root here")
    endif()
    math(EXPR at "${at} + 1")
    list(GET _nanscope_include_roots ${at} root)
    list(APPEND _nanscope_to_visit ${root}/${included})
  endforeach()
endwhile()
foreach(header IN LISTS _nanscope_installed_headers)
  string(REGEX REPLACE ".*/include/(nanscope.*)/[^/]+$" "\\1" folder "${header}")
  install(FILES ${header} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/${folder})
endforeach()
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

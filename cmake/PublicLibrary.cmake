# A nanscope library's public face, declared once: its headers (the calling
# folder's include/, installed under include/), the name the installed
# package exports it under, and the same nanscope::NAME inside the build, so
# that a target links it by one name wherever it is built.
function(nanscope_public_library target export_name)
  target_include_directories(${target} PUBLIC
    $<BUILD_INTERFACE:${CMAKE_CURRENT_SOURCE_DIR}/include> $<INSTALL_INTERFACE:include>)
  set_target_properties(${target} PROPERTIES EXPORT_NAME ${export_name})
  add_library(nanscope::${export_name} ALIAS ${target})
endfunction()

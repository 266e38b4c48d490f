# nanscope_test_paths(TARGET NAME VALUE [NAME VALUE ...]): the paths a test
# program reads as nanscope::test::paths::NAME (tests/support/test_paths.hpp),
# written into one source file generated for it. VALUE may be a generator
# expression ($<TARGET_FILE:nanscope-train>).
#
# Not compile definitions: a path inside a compiled test source differs in
# every clone, so a fresh clone (CI's) rebuilt every LibTorch-heavy test batch
# although ccache held the same code compiled from another folder. Here only
# this small file, outside the unity batches, differs.
function(nanscope_test_paths target)
  set(source ${CMAKE_CURRENT_BINARY_DIR}/${target}_paths.cpp)
  set(body "// Written by CMake (nanscope_test_paths): the paths ${target} reads.\n")
  string(APPEND body "#include \"${PROJECT_SOURCE_DIR}/tests/support/test_paths.hpp\"\n\n")
  string(APPEND body "namespace nanscope::test::paths {\n")
  set(pairs "${ARGN}")  # quoted: an empty VALUE stays a list element
  list(LENGTH pairs count)
  math(EXPR odd "${count} % 2")
  if(odd)
    message(FATAL_ERROR "nanscope_test_paths(${target}): NAME VALUE pairs expected, got '${ARGN}'")
  endif()
  while(count GREATER 0)
    list(POP_FRONT pairs name value)
    string(APPEND body "const char* const ${name} = \"${value}\";\n")
    math(EXPR count "${count} - 2")
  endwhile()
  string(APPEND body "}  // namespace nanscope::test::paths\n")
  file(GENERATE OUTPUT ${source} CONTENT "${body}")
  target_sources(${target} PRIVATE ${source})
  set_source_files_properties(${source} PROPERTIES SKIP_UNITY_BUILD_INCLUSION ON SKIP_PRECOMPILE_HEADERS ON)
endfunction()

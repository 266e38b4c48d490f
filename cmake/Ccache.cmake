# LibTorch headers are slow to compile; ccache makes a rebuild of an unchanged
# tree nearly free, also from a fresh clone in another folder (CI): BASEDIR
# makes paths relative before hashing. (Unity batches include their sources by
# absolute path, so those hit the cache only from the same folder.)
find_program(NANSCOPE_CCACHE ccache)
if(NANSCOPE_CCACHE AND NOT CMAKE_CXX_COMPILER_LAUNCHER)
  set(CMAKE_CXX_COMPILER_LAUNCHER
      ${CMAKE_COMMAND} -E env CCACHE_BASEDIR=${PROJECT_SOURCE_DIR}
      "CCACHE_SLOPPINESS=time_macros,include_file_mtime,include_file_ctime"
      ${NANSCOPE_CCACHE})
endif()

# LibTorch headers are slow to compile; ccache makes a rebuild of an unchanged
# tree (a fresh CI clone on the same machine) nearly free.
find_program(NANSCOPE_CCACHE ccache)
if(NANSCOPE_CCACHE AND NOT CMAKE_CXX_COMPILER_LAUNCHER)
  set(CMAKE_CXX_COMPILER_LAUNCHER "${NANSCOPE_CCACHE}")
  # Precompiled headers carry timestamps; let ccache hash their contents instead.
  set(ENV{CCACHE_SLOPPINESS} "pch_defines,time_macros,include_file_mtime,include_file_ctime")
endif()

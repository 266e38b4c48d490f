# LibTorch headers are slow to compile; ccache makes a rebuild of an unchanged
# tree nearly free, also from a fresh clone in another folder (CI). For that,
# nothing compiled may name the folder, nor differ by who started the build:
# - BASEDIR makes the paths on the command line relative before hashing;
# - -ffile-prefix-map writes __FILE__ (GoogleTest's failure locations) and the
#   debug information (the sanitizer lane's -g) relative to the repository,
#   and ccache then leaves the build folder out of the hash of a -g compile;
# - the test programs read their paths from a generated file
#   (cmake/TestPaths.cmake), not from -D definitions;
# - ccache hashes the locale variables, and Python sets LC_CTYPE=C.UTF-8 for
#   the processes it starts when the locale is C (PEP 538): `pip install .`
#   (setup.py runs this build) in the 2.14 lane's chroot, whose environment has
#   no locale, missed every object the lane had just built. The compiler's
#   LC_CTYPE is what LANG says (unset: the C locale), whoever starts it.
# - the LibTorch targets' precompiled header (cmake/TorchUnityBuild.cmake):
#   ccache caches the image and the files that use it only with pch_defines
#   (it cannot see which macros the image was made with) and time_macros.
# The option is set with or without ccache, so an object is the same either way.
add_compile_options(-ffile-prefix-map=${PROJECT_SOURCE_DIR}/=)
find_program(NANSCOPE_CCACHE ccache)
if(NANSCOPE_CCACHE AND NOT CMAKE_CXX_COMPILER_LAUNCHER)
  set(CMAKE_CXX_COMPILER_LAUNCHER
      ${CMAKE_COMMAND} -E env --unset=LC_CTYPE CCACHE_BASEDIR=${PROJECT_SOURCE_DIR}
      "CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime"
      ${NANSCOPE_CCACHE})
endif()

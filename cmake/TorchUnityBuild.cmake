# How the targets that include LibTorch are compiled: in unity batches.
#
# LibTorch's headers, not our code, are what a build here spends its time on:
# parsing <ATen/ATen.h> takes about 6 s and <torch/nn/module.h> about 9 s per
# translation unit on this project's 2-core machines, before a line of ours.
# A precompiled header did not pay: GCC's image of those headers was 592 MB and
# loading it cost 9-14 s per file, so even files that use no LibTorch at all
# took that long (bench/build_time.sh; a cold build went from 486 s to the
# figure in docs/install.md). A unity batch parses the headers once for up to
# NANSCOPE_UNITY_BATCH files, so keep file-local names unique within a target
# (a helper in an anonymous namespace is visible to the rest of its batch).
#
# -DNANSCOPE_UNITY_BUILD=OFF compiles one file at a time: slower from clean,
# quicker to rebuild after touching one file.
option(NANSCOPE_UNITY_BUILD "Compile LibTorch-using targets in unity batches" ON)
set(NANSCOPE_UNITY_BATCH 8 CACHE STRING "Source files per unity batch")

function(nanscope_unity_build target)
  set_target_properties(${target} PROPERTIES UNITY_BUILD ${NANSCOPE_UNITY_BUILD}
                                             UNITY_BUILD_BATCH_SIZE ${NANSCOPE_UNITY_BATCH})
endfunction()

# Test programs: unity batches too, and -O1. A test's own code only calls into
# the libraries, which stay -O3; at -O1 a LibTorch-heavy batch of tests
# compiles in 26 s instead of 35 s on this project's machines.
function(nanscope_test_build target)
  nanscope_unity_build(${target})
  target_compile_options(${target} PRIVATE $<$<CONFIG:Release>:-O1>)
endfunction()

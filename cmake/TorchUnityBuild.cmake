# How the targets that include LibTorch are compiled: in unity batches, with a
# precompiled header of LibTorch's common headers.
#
# LibTorch's headers, not our code, are what a build here spends its time on:
# parsing <ATen/ATen.h> takes about 5 s and <torch/nn/module.h> about 7 s per
# translation unit on this project's 2-core machines, before a line of ours.
# A unity batch parses them once for up to NANSCOPE_UNITY_BATCH files, so keep
# file-local names unique within a target (a helper in an anonymous namespace
# is visible to the rest of its batch).
#
# The precompiled header holds <torch/nn/module.h> and <torch/types.h> only,
# what nearly every such file includes: GCC's image of them is about 380 MB and
# loads in under 2 s, where their text takes 7 (a core batch: 8.5 -> 4.9 s). An
# image of all of <torch/torch.h> did not pay: 570 MB, and loading it cost
# nearly what parsing the headers a file really includes does (8.2 -> 7.6 s).
# GCC takes an image only in code compiled as it was made (-fPIC or -fPIE, and
# the optimization level of the inline functions it holds), so every LibTorch
# target compiles -fPIC, as the libraries must for the Python module, programs
# too, and there are two images: one at the build's optimization, one at the
# tests' (test batches at -O1 with a -O3 image spent twice as long optimizing:
# 25 s a batch, against 21 s with no image and 17 s with their own); one only
# where the build's optimization is the tests' (below).
#
# -DNANSCOPE_UNITY_BUILD=OFF compiles one file at a time: slower from clean,
# quicker to rebuild after touching one file. -DNANSCOPE_TORCH_PCH=OFF parses
# the headers in every file.
option(NANSCOPE_UNITY_BUILD "Compile LibTorch-using targets in unity batches" ON)
set(NANSCOPE_UNITY_BATCH 8 CACHE STRING "Source files per unity batch")
option(NANSCOPE_TORCH_PCH "Compile LibTorch-using targets with a precompiled header of LibTorch's common headers" ON)

# Test programs' own code is compiled at -O1: it only calls into the
# libraries, which stay -O3, and at -O1 a LibTorch-heavy batch of tests
# compiles in 26 s instead of 35 s on this project's machines.
set(NANSCOPE_TEST_OPTIMIZATION $<$<CONFIG:Release>:-O1>)
# A build whose release flags are the tests' level already (the 2.x test
# lane's, scripts/test-torch2.sh) makes one image for both kinds of code.
if(CMAKE_CXX_FLAGS_RELEASE MATCHES "(^| )-O1( |$)")
  set(_nanscope_test_image release)
else()
  set(_nanscope_test_image test)
endif()

# The target that makes the image for one kind of code (release, or test at
# the tests' optimization), made at its first use; the others reuse its image.
function(_nanscope_torch_pch_maker kind)
  set(maker nanscope_torch_pch_${kind})
  if(TARGET ${maker})
    return()
  endif()
  add_library(${maker} OBJECT ${PROJECT_SOURCE_DIR}/cmake/torch_pch.cpp)
  target_link_libraries(${maker} PRIVATE nanscope_torch)
  target_precompile_headers(${maker} PRIVATE <torch/nn/module.h> <torch/types.h>)
  if(kind STREQUAL "test")
    target_compile_options(${maker} PRIVATE ${NANSCOPE_TEST_OPTIMIZATION})
  endif()
endfunction()

function(_nanscope_torch_target target kind)
  set_target_properties(${target} PROPERTIES UNITY_BUILD ${NANSCOPE_UNITY_BUILD}
                                             UNITY_BUILD_BATCH_SIZE ${NANSCOPE_UNITY_BATCH})
  if(NOT NANSCOPE_TORCH_PCH)
    return()
  endif()
  get_target_property(type ${target} TYPE)
  if(type STREQUAL "EXECUTABLE")
    # After CMake's -fPIE, which it cancels: the program is still linked as a
    # position-independent executable.
    target_compile_options(${target} PRIVATE -fPIC)
  endif()
  _nanscope_torch_pch_maker(${kind})
  target_precompile_headers(${target} REUSE_FROM nanscope_torch_pch_${kind})
endfunction()

# A target that includes LibTorch, compiled as such: in unity batches, with the
# precompiled header.
function(nanscope_torch_build target)
  _nanscope_torch_target(${target} release)
endfunction()

# A test program: the same, at the tests' optimization.
function(nanscope_test_build target)
  _nanscope_torch_target(${target} ${_nanscope_test_image})
  target_compile_options(${target} PRIVATE ${NANSCOPE_TEST_OPTIMIZATION})
endfunction()

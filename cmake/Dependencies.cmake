# Every dependency comes from the system (Debian packages) or from
# CMAKE_PREFIX_PATH (an official LibTorch archive, a PyTorch wheel's
# torch/share/cmake). Nothing is downloaded or vendored.
find_package(HDF5 REQUIRED COMPONENTS C)
find_package(Torch REQUIRED)
find_package(CLI11 REQUIRED)
find_package(Threads REQUIRED)

# Torch's CMake config puts its flags on TORCH_CXX_FLAGS (the C++11 ABI switch);
# they must reach every TU that includes a LibTorch header.
separate_arguments(NANSCOPE_TORCH_FLAGS UNIX_COMMAND "${TORCH_CXX_FLAGS}")
add_library(nanscope_torch INTERFACE)
target_link_libraries(nanscope_torch INTERFACE ${TORCH_LIBRARIES})
target_compile_options(nanscope_torch INTERFACE ${NANSCOPE_TORCH_FLAGS})
# Torch's headers are noisy under -Wall; treat them as system headers.
get_target_property(_torch_includes torch INTERFACE_INCLUDE_DIRECTORIES)
if(_torch_includes)
  target_include_directories(nanscope_torch SYSTEM INTERFACE ${_torch_includes})
endif()

# NVTX3 is header-only and ships with the CUDA toolkit; ranges compile out without it.
find_path(NANSCOPE_NVTX3_INCLUDE nvtx3/nvToolsExt.h
          HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda/include /usr/include)

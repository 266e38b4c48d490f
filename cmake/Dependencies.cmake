# Every dependency comes from the system (Debian packages) or from
# CMAKE_PREFIX_PATH (an official LibTorch archive, a PyTorch wheel's
# torch/share/cmake). Nothing is downloaded or vendored.
find_package(HDF5 REQUIRED COMPONENTS C)
find_package(CLI11 REQUIRED)
find_package(Threads REQUIRED)
if(NANSCOPE_LIGHT)
  return()
endif()
find_package(Torch REQUIRED)

# Torch's CMake config puts its flags on TORCH_CXX_FLAGS (the C++11 ABI switch);
# they must reach every TU that includes a LibTorch header.
separate_arguments(NANSCOPE_TORCH_FLAGS UNIX_COMMAND "${TORCH_CXX_FLAGS}")
add_library(nanscope_torch INTERFACE)
set_target_properties(nanscope_torch PROPERTIES EXPORT_NAME torch)
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

# c10d (torch.distributed's C++ core) is inside libtorch; its ProcessGroupGloo
# header is compiled only with USE_C10D_GLOO and includes Gloo's headers
# (Debian: libgloo-dev; the PyTorch wheel ships them in its include dir).
# Without them nanscope-train still builds and runs as one process.
find_path(NANSCOPE_GLOO_INCLUDE gloo/context.h HINTS ${_torch_includes} /usr/include)
find_path(NANSCOPE_C10D_INCLUDE torch/csrc/distributed/c10d/ProcessGroupGloo.hpp HINTS ${_torch_includes})
add_library(nanscope_c10d INTERFACE)
if(NANSCOPE_GLOO_INCLUDE AND NANSCOPE_C10D_INCLUDE)
  target_include_directories(nanscope_c10d SYSTEM INTERFACE ${NANSCOPE_GLOO_INCLUDE})
  target_compile_definitions(nanscope_c10d INTERFACE USE_C10D_GLOO NANSCOPE_HAVE_C10D_GLOO=1)
  set(NANSCOPE_HAVE_C10D_GLOO ON)
  message(STATUS "nanscope: multi-process runs on c10d Gloo (${NANSCOPE_GLOO_INCLUDE})")
else()
  message(STATUS "nanscope: no c10d Gloo headers (install libgloo-dev); nanscope-train runs as one process only")
endif()
# NCCL for CUDA ranks, where this LibTorch was built with CUDA.
if(TORCH_CUDA_LIBRARIES AND EXISTS "${NANSCOPE_C10D_INCLUDE}/torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp")
  target_compile_definitions(nanscope_c10d INTERFACE USE_C10D_NCCL NANSCOPE_HAVE_C10D_NCCL=1)
  message(STATUS "nanscope: CUDA ranks on c10d NCCL")
endif()

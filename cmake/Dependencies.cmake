# Every dependency comes from the system (Debian packages) or from
# CMAKE_PREFIX_PATH (an official LibTorch archive, a PyTorch wheel's
# torch/share/cmake). Nothing is downloaded or vendored.
find_package(HDF5 REQUIRED COMPONENTS C)
# The HDF5 C library by path, for format/ to link: FindHDF5 gives paths with
# HDF5 1.x, and with 2.x (found through its own CMake config) the names of its
# targets (hdf5-shared), which an installed nanscope's users could not resolve.
set(NANSCOPE_HDF5_C_LIBRARIES "")
foreach(_hdf5_library IN LISTS HDF5_C_LIBRARIES)
  if(TARGET "${_hdf5_library}")
    get_target_property(_hdf5_aliased "${_hdf5_library}" ALIASED_TARGET)
    if(_hdf5_aliased)
      set(_hdf5_library "${_hdf5_aliased}")
    endif()
    get_target_property(_hdf5_library "${_hdf5_library}" LOCATION)
  endif()
  list(APPEND NANSCOPE_HDF5_C_LIBRARIES "${_hdf5_library}")
endforeach()
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
# LibTorch's headers may need a newer C++ than nanscope's own (2.14's refuse
# C++17): its CMake config says which on the torch target, and every target
# that includes them gets it through this one.
get_target_property(_torch_standard torch CXX_STANDARD)
if(_torch_standard AND _torch_standard GREATER CMAKE_CXX_STANDARD)
  target_compile_features(nanscope_torch INTERFACE cxx_std_${_torch_standard})
endif()
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

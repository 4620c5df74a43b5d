# LibTorch, from PyPI's CUDA-enabled torch wheel that deploy/install-deps.sh installs, wrapped in
# one INTERFACE target, trainerd::torch. Nothing else in the build names Torch's variables.
#
# Find it with -DCMAKE_PREFIX_PATH=$(python -c 'import torch;print(torch.utils.cmake_prefix_path)')
# (the Makefile does this). The wheel's CMake config looks for a CUDA toolkit (nvcc and headers) to
# build against; no GPU is needed to build or to run.
find_package(Torch CONFIG REQUIRED)

add_library(trainerd_torch INTERFACE)
add_library(trainerd::torch ALIAS trainerd_torch)
target_link_libraries(trainerd_torch INTERFACE ${TORCH_LIBRARIES})
# TORCH_CXX_FLAGS carries the C++ ABI define; it must match Debian's libraries (both use the new ABI).
separate_arguments(_trainerd_torch_flags UNIX_COMMAND "${TORCH_CXX_FLAGS}")
target_compile_options(trainerd_torch INTERFACE ${_trainerd_torch_flags})

# Whether this LibTorch was built with CUDA (the pinned wheel is); the engine's CUDA paths then
# compile and link everywhere and run wherever a GPU is present.
if(TARGET torch_cuda OR TARGET c10_cuda)
  set(TRAINERD_TORCH_HAS_CUDA ON)
else()
  set(TRAINERD_TORCH_HAS_CUDA OFF)
endif()
message(STATUS "trainerd: LibTorch ${Torch_VERSION}, CUDA build: ${TRAINERD_TORCH_HAS_CUDA}")

# One precompiled <torch/torch.h> for every target that compiles with LibTorch: the header costs
# about 20 s per translation unit on two cores, and it is built once here instead of once per
# target (the engine's rooms, the worker programs, the engine's tests). trainerd_use_torch(<target>)
# gives a target LibTorch (PRIVATE: its consumers do not compile with LibTorch's include
# directories unless they ask for them too) and that header. A target that reuses it must compile
# with the same flags: trainerd_target_defaults, no flags of its own that change the header.
add_library(trainerd_torch_pch OBJECT ${CMAKE_CURRENT_LIST_DIR}/torch_pch.cc)
target_link_libraries(trainerd_torch_pch PRIVATE trainerd::torch)
target_precompile_headers(trainerd_torch_pch PRIVATE <torch/torch.h>)
trainerd_target_defaults(trainerd_torch_pch)

# (tests/ may set TRAINERD_TORCH_PCH_TARGET to a header precompiled with the tests' flags.)
function(trainerd_use_torch target)
  target_link_libraries(${target} PRIVATE trainerd::torch)
  if(DEFINED TRAINERD_TORCH_PCH_TARGET)
    target_precompile_headers(${target} REUSE_FROM ${TRAINERD_TORCH_PCH_TARGET})
  else()
    target_precompile_headers(${target} REUSE_FROM trainerd_torch_pch)
  endif()
endfunction()

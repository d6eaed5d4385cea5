# CUDA is optional: the CUDA backend is built only when a CUDA compiler is found.
# STRATA_CUDA=AUTO (default) detects it, ON requires it, OFF never builds it.
set(STRATA_CUDA AUTO CACHE STRING "Build the CUDA backend: AUTO, ON or OFF")
set(STRATA_HAVE_CUDA OFF)
if(NOT STRATA_CUDA STREQUAL "OFF")
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 90)
    endif()
    enable_language(CUDA)
    find_package(CUDAToolkit REQUIRED)
    set(CMAKE_CUDA_STANDARD 20)
    set(STRATA_HAVE_CUDA ON)
  elseif(STRATA_CUDA STREQUAL "ON")
    message(FATAL_ERROR "STRATA_CUDA=ON but no CUDA compiler was found")
  endif()
endif()
message(STATUS "Strata CUDA backend: ${STRATA_HAVE_CUDA}")

# For a directory that compiles .cu files: the top level's GCC warning flags go to nvcc's host
# compiler (nvcc rejects them itself), and CMake 3.25 learns nvcc's C++20 flag (a CUDA standard
# of 20, which the C++ standard implies, fails at generation otherwise; nvcc 12+ takes it).
macro(strata_cuda_directory)
  get_property(strata_inherited_options DIRECTORY PROPERTY COMPILE_OPTIONS)
  set_property(DIRECTORY PROPERTY COMPILE_OPTIONS "")
  foreach(opt IN LISTS strata_inherited_options)
    add_compile_options("$<$<COMPILE_LANGUAGE:CXX>:${opt}>"
                        "$<$<COMPILE_LANGUAGE:CUDA>:SHELL:-Xcompiler=${opt}>")
  endforeach()
  if(NOT DEFINED CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
    set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
  endif()
  # No --use_fast_math: the kernels pick fast intrinsics explicitly where bf16 tolerance allows.
  add_compile_options("$<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr>")
endmacro()

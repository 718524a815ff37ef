# Finds oneDNN 2.x for the CPU and defines the imported target tapegrad::dnnl.
#
# Why not find_package(dnnl CONFIG): Debian builds oneDNN with its OpenCL GPU runtime, so
# oneDNN's own package config calls find_package(OpenCL REQUIRED) and links OpenCL::OpenCL,
# which needs the OpenCL development files (ocl-icd-opencl-dev, only "recommended" by
# libdnnl-dev). tapegrad runs oneDNN on the CPU only and never includes an OpenCL header, and
# libdnnl.so already names its own runtime dependencies, so the header and the library are all
# it needs. The same file is installed with tapegrad's package config, so an outside project
# finds oneDNN the same way.
#
# Sets TAPEGRAD_DNNL_FOUND, and TAPEGRAD_DNNL_MESSAGE when it is false. Hints: DNNL_ROOT, or
# CMAKE_PREFIX_PATH, for a oneDNN installed outside the system directories.
if(TARGET tapegrad::dnnl)
  set(TAPEGRAD_DNNL_FOUND TRUE)
  return()
endif()

find_path(TAPEGRAD_DNNL_INCLUDE_DIR oneapi/dnnl/dnnl.hpp HINTS ${DNNL_ROOT} PATH_SUFFIXES include)
find_library(TAPEGRAD_DNNL_LIBRARY NAMES dnnl HINTS ${DNNL_ROOT} PATH_SUFFIXES lib lib64)
set(TAPEGRAD_DNNL_FOUND FALSE)
if(NOT TAPEGRAD_DNNL_INCLUDE_DIR OR NOT TAPEGRAD_DNNL_LIBRARY)
  set(TAPEGRAD_DNNL_MESSAGE "oneDNN not found (header oneapi/dnnl/dnnl.hpp: ${TAPEGRAD_DNNL_INCLUDE_DIR}, "
      "library libdnnl: ${TAPEGRAD_DNNL_LIBRARY}); on Debian 12 install libdnnl-dev, or set DNNL_ROOT")
  return()
endif()

# The matmul code is written against oneDNN 2.x (matmul::desc, then primitive_desc); 3.x
# changed that API.
file(STRINGS "${TAPEGRAD_DNNL_INCLUDE_DIR}/oneapi/dnnl/dnnl_version.h" _tapegrad_dnnl_major
     REGEX "^#define DNNL_VERSION_MAJOR [0-9]+")
string(REGEX REPLACE "^#define DNNL_VERSION_MAJOR ([0-9]+).*" "\\1" _tapegrad_dnnl_major "${_tapegrad_dnnl_major}")
if(NOT _tapegrad_dnnl_major STREQUAL "2")
  set(TAPEGRAD_DNNL_MESSAGE "tapegrad needs oneDNN 2.x (Debian 12 ships 2.6); "
      "${TAPEGRAD_DNNL_INCLUDE_DIR}/oneapi/dnnl/dnnl_version.h says major version '${_tapegrad_dnnl_major}'")
  return()
endif()

add_library(tapegrad::dnnl UNKNOWN IMPORTED)
set_target_properties(tapegrad::dnnl PROPERTIES
  IMPORTED_LOCATION "${TAPEGRAD_DNNL_LIBRARY}"
  INTERFACE_INCLUDE_DIRECTORIES "${TAPEGRAD_DNNL_INCLUDE_DIR}")
set(TAPEGRAD_DNNL_FOUND TRUE)

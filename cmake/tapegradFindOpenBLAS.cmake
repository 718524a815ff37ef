# Finds OpenBLAS (float64 products: cblas_dgemm) and defines the imported target tapegrad::openblas.
#
# Debian installs OpenBLAS's headers per variant (openblas-pthread, openblas-openmp,
# openblas-serial) and points libopenblas.so at the chosen one; the header searched for is
# openblas_config.h, which only OpenBLAS's cblas.h sits next to (the reference BLAS has a
# cblas.h too, without openblas_set_num_threads). The same file is installed with tapegrad's
# package config, so an outside project finds OpenBLAS the same way.
#
# Sets TAPEGRAD_OPENBLAS_FOUND, and TAPEGRAD_OPENBLAS_MESSAGE when it is false. Hint:
# OpenBLAS_ROOT, or CMAKE_PREFIX_PATH.
if(TARGET tapegrad::openblas)
  set(TAPEGRAD_OPENBLAS_FOUND TRUE)
  return()
endif()

find_library(TAPEGRAD_OPENBLAS_LIBRARY NAMES openblas HINTS ${OpenBLAS_ROOT} PATH_SUFFIXES lib lib64)
find_path(TAPEGRAD_OPENBLAS_INCLUDE_DIR openblas_config.h HINTS ${OpenBLAS_ROOT}
          PATH_SUFFIXES include/${CMAKE_LIBRARY_ARCHITECTURE}/openblas-pthread include/${CMAKE_LIBRARY_ARCHITECTURE}/openblas-openmp
                        include/${CMAKE_LIBRARY_ARCHITECTURE}/openblas-serial include/openblas include)
set(TAPEGRAD_OPENBLAS_FOUND FALSE)
if(NOT TAPEGRAD_OPENBLAS_LIBRARY OR NOT TAPEGRAD_OPENBLAS_INCLUDE_DIR)
  set(TAPEGRAD_OPENBLAS_MESSAGE "OpenBLAS not found (header openblas_config.h: ${TAPEGRAD_OPENBLAS_INCLUDE_DIR}, "
      "library libopenblas: ${TAPEGRAD_OPENBLAS_LIBRARY}); on Debian 12 install libopenblas-dev, or set OpenBLAS_ROOT")
  return()
endif()

add_library(tapegrad::openblas UNKNOWN IMPORTED)
set_target_properties(tapegrad::openblas PROPERTIES
  IMPORTED_LOCATION "${TAPEGRAD_OPENBLAS_LIBRARY}"
  INTERFACE_INCLUDE_DIRECTORIES "${TAPEGRAD_OPENBLAS_INCLUDE_DIR}")
set(TAPEGRAD_OPENBLAS_FOUND TRUE)

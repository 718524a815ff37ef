# The distributed room: ProcessGroup and DataParallel. Always built; on MPI when it is found
# (Debian: libopenmpi-dev, and openmpi-bin to launch), otherwise every process group is one
# process (distributed/communicator_none.cpp). MPI's C calls only: its C++ bindings are skipped,
# so libmpi alone is linked, by its full path, which the export carries (as SentencePiece's).
# TAPEGRAD_MPI=OFF builds without MPI even where it is installed.
option(TAPEGRAD_MPI "Build the distributed room on MPI when it is found" ON)
target_sources(tapegrad PRIVATE distributed/process_group.cpp distributed/comm_thread.cpp distributed/communicator_solo.cpp
               distributed/sum_tree.cpp distributed/data_parallel.cpp distributed/exchange.cpp distributed/training_state.cpp)
if(TAPEGRAD_MPI)
  set(MPI_CXX_SKIP_MPICXX ON)
  find_package(MPI COMPONENTS CXX)
endif()
if(TAPEGRAD_MPI AND MPI_CXX_FOUND)
  set(TAPEGRAD_MPI_FOUND TRUE)
  set(TAPEGRAD_MPI_LIBRARIES ${MPI_CXX_LIBRARIES})
  list(FILTER TAPEGRAD_MPI_LIBRARIES EXCLUDE REGEX "mpi_cxx")
  message(STATUS "MPI: found (${TAPEGRAD_MPI_LIBRARIES}, launcher ${MPIEXEC_EXECUTABLE}); data-parallel training runs over it")
  target_sources(tapegrad PRIVATE distributed/communicator_mpi.cpp)
  set_source_files_properties(distributed/communicator_mpi.cpp PROPERTIES COMPILE_DEFINITIONS "OMPI_SKIP_MPICXX=1;MPICH_SKIP_MPICXX=1")
  target_include_directories(tapegrad SYSTEM PRIVATE ${MPI_CXX_INCLUDE_DIRS})
  target_link_libraries(tapegrad PRIVATE ${TAPEGRAD_MPI_LIBRARIES})
  # How the tests launch processes. Open MPI: root needs its consent, more processes than cores
  # need --oversubscribe, threads need --bind-to none; its shared-memory single copy fails in some
  # containers. One OpenMP thread per process: the ranks share the cores.
  execute_process(COMMAND ${MPIEXEC_EXECUTABLE} --version OUTPUT_VARIABLE _mpi_version ERROR_QUIET)
  set(TAPEGRAD_MPIEXEC_FLAGS ${MPIEXEC_PREFLAGS})
  set(TAPEGRAD_MPIEXEC_ENV OMP_NUM_THREADS=1)
  if(_mpi_version MATCHES "OpenRTE|Open MPI|open-mpi")
    list(APPEND TAPEGRAD_MPIEXEC_FLAGS --oversubscribe --bind-to none)
    list(APPEND TAPEGRAD_MPIEXEC_ENV OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none)
  endif()
  # Under LeakSanitizer, Open MPI's own allocations (its plugins', unloaded by MPI_Finalize, so
  # beyond a suppression by name) count as leaks in every process it starts; the suites run
  # without a launcher check tapegrad's own, the distributed room's included.
  if(TAPEGRAD_SANITIZE OR TAPEGRAD_FUZZ)
    list(APPEND TAPEGRAD_MPIEXEC_ENV ASAN_OPTIONS=detect_leaks=0)
  endif()
else()
  set(TAPEGRAD_MPI_FOUND FALSE)
  set(_why "NOT found (Debian: libopenmpi-dev openmpi-bin)")
  if(NOT TAPEGRAD_MPI)
    set(_why "left out (TAPEGRAD_MPI=OFF)")
  endif()
  message(STATUS "MPI: ${_why}; a ProcessGroup is one process, and the multi-process tests are left out")
  target_sources(tapegrad PRIVATE distributed/communicator_none.cpp)
endif()

# The include check can fail: a tree with one layer reaching into kernels/, one kernel into ops/,
# an op calling OpenBLAS itself, an op building a loop for several CPUs (runtime/cpu.hpp), and a
# layer that reaches kernels/ through a header it may include (autodiff/check.hpp, which here
# includes a kernel: that header is refused too) and MPI called outside its one file must be
# refused, naming the files.
#   cmake -DCHECKER=tools/check_includes.cmake -DWORK=<scratch dir> -P check_house_rules.cmake
file(REMOVE_RECURSE "${WORK}")
file(WRITE "${WORK}/layers/bad_layer.cpp" "#include \"kernels/product.hpp\"\n#include \"tapegrad/ops/matmul.hpp\"\n")
file(WRITE "${WORK}/kernels/bad_kernel.cpp" "#include \"ops/op.hpp\"\n#include \"autodiff/loops.hpp\"\n")
file(WRITE "${WORK}/ops/bad_blas.cpp" "#include <cblas.h>\n#include <vector>\n")
file(WRITE "${WORK}/ops/bad_clones.cpp" "#include \"runtime/cpu.hpp\"\n#include \"ops/op.hpp\"\n")
file(WRITE "${WORK}/ops/fine.cpp" "#include \"kernels/product.hpp\"\n#include \"runtime/parallel.hpp\"\n")
file(WRITE "${WORK}/layers/sneaky_layer.cpp" "#include \"autodiff/check.hpp\"\n")
file(WRITE "${WORK}/autodiff/check.hpp" "#include \"kernels/attention_mask.hpp\"\n")
file(WRITE "${WORK}/kernels/attention_mask.hpp" "#include <vector>\n")
file(WRITE "${WORK}/distributed/bad_mpi.cpp" "#include <mpi.h>\n#include \"distributed/communicator.hpp\"\n")
include(${CMAKE_CURRENT_LIST_DIR}/expect_refusal.cmake)
expect_refusal("a layer that includes kernels/product.hpp" "layers/bad_layer.cpp: includes kernels/product.hpp"
               "kernels/bad_kernel.cpp: includes ops/op.hpp"
               "ops/bad_blas.cpp: includes cblas.h (OpenBLAS is called from kernels/matmul_f64.cpp alone)"
               "ops/bad_clones.cpp: includes runtime/cpu.hpp, which ops may not"
               "layers/sneaky_layer.cpp: reaches kernels/attention_mask.hpp through autodiff/check.hpp, which layers may not"
               "autodiff/check.hpp: includes kernels/attention_mask.hpp, which autodiff may not"
               "distributed/bad_mpi.cpp: includes mpi.h (MPI is called from distributed/communicator_mpi.cpp alone)" "7 include(s)")

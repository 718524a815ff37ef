// Internal: one function built for several CPUs at once, the version picked when the program
// starts by the CPU that runs it. The build never assumes the build machine's CPU.
#pragma once

// TAPEGRAD_CPU_CLONES: compiled for AVX-512 (x86-64-v4), AVX2 + FMA (v3) and baseline x86-64
// (GCC's function multiversioning). TAPEGRAD_CPU_CLONES_FLATTENED also inlines every call into
// each version, for a function whose small helpers must be built at its width. With clang,
// which multiversions neither templates nor flattened functions, and off x86-64, a function is
// built once. Files whose versions must give the same bits build with -ffp-contract=off
// (CMakeLists.txt): no version fuses a multiply into an add that another does not.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define TAPEGRAD_CPU_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#define TAPEGRAD_CPU_CLONES_FLATTENED __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"), flatten))
#else
#define TAPEGRAD_CPU_CLONES
#define TAPEGRAD_CPU_CLONES_FLATTENED
#endif

// For code written with one instruction set's intrinsics, called only where the CPU has it.
#if defined(__x86_64__) && defined(__GNUC__)
#define TAPEGRAD_TARGET_AVX512 __attribute__((target("avx512f")))
#define TAPEGRAD_TARGET_AVX2 __attribute__((target("avx2,fma")))
#endif

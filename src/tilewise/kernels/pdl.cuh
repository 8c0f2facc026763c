// pdl.cuh - programmatic dependent launch (Hopper's `griddepcontrol`), the first text of every model kernel source.
//
// A launch made with the PDL attribute (`CUDADevice.run/capture(..., pdl=True)`) may start while the launch before
// it on the stream still runs. So every kernel of the model's families calls PDL_WAIT() before it reads or writes
// any memory that another launch writes; before it, a kernel may only read what no launch writes (the weights),
// which lets a matmul copy its first weight stages while its predecessor finishes. PDL_LAUNCH_DEPENDENTS() follows
// the wait: from then on the next launch's blocks may become resident. Since a launch triggers its successor only
// after its own wait has returned, at most one launch runs ahead. PDL_BEGIN() is both, the first thing most kernels
// do. griddepcontrol.wait returns once the preceding grid has completed and its writes are visible; a grid launched
// without the attribute (timing, tuning) has nothing to wait for, so both are no-ops there, and before sm_90 they
// compile to nothing. tests/unit/test_cuda_pdl.py checks that every kernel of the model's sources waits.
#ifndef TILEWISE_PDL
#define TILEWISE_PDL
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define PDL_WAIT() asm volatile("griddepcontrol.wait;" ::: "memory")
#define PDL_LAUNCH_DEPENDENTS() asm volatile("griddepcontrol.launch_dependents;" ::: "memory")
#else
#define PDL_WAIT() ((void)0)
#define PDL_LAUNCH_DEPENDENTS() ((void)0)
#endif
#define PDL_BEGIN() \
  do {              \
    PDL_WAIT();     \
    PDL_LAUNCH_DEPENDENTS(); \
  } while (0)
#endif

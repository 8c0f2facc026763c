// pdl.cuh - programmatic dependent launch (Hopper's `griddepcontrol`), the first text of every model kernel source.
//
// A launch made with the PDL attribute (`CUDADevice.run/capture(..., pdl=True)`) may start while the launch before
// it on the stream still runs. So every kernel of the model's families calls PDL_WAIT() before it reads or writes
// any memory that another launch writes; before it, a kernel may only read what no launch writes (the weights),
// which lets a matmul copy its first weight stages while its predecessor finishes. PDL_BEGIN() is that wait, the
// first thing most kernels do. The next launch is let in implicitly, as this launch's blocks exit (the wgr matmul
// lets it in earlier, once all its blocks are past their K loops: PDL_LAUNCH_DEPENDENTS() there); an explicit
// griddepcontrol.launch_dependents right after the wait (PDL_EARLY_TRIGGER 1) lets the next grid's blocks take SM
// room this grid's later waves still need, and decided slower in whole-decision races
// (experiments/pdl_trigger_cuda.py races both). griddepcontrol.wait returns once the preceding grid has completed
// and its writes are visible; a grid launched without the attribute (timing, tuning) has nothing to wait for, so it
// is a no-op there, and before sm_90 both compile to nothing. tests/unit/test_cuda_pdl.py checks that every kernel
// of the model's sources waits.
#ifndef TILEWISE_PDL
#define TILEWISE_PDL
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define PDL_WAIT() asm volatile("griddepcontrol.wait;" ::: "memory")
#define PDL_LAUNCH_DEPENDENTS() asm volatile("griddepcontrol.launch_dependents;" ::: "memory")
#else
#define PDL_WAIT() ((void)0)
#define PDL_LAUNCH_DEPENDENTS() ((void)0)
#endif
#define PDL_EARLY_TRIGGER 0
#define PDL_BEGIN()                             \
  do {                                          \
    PDL_WAIT();                                 \
    if (PDL_EARLY_TRIGGER) PDL_LAUNCH_DEPENDENTS(); \
  } while (0)
#endif

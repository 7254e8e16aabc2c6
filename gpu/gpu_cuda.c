/*
 * Device probe. With the CUDA toolkit the build links cudart and asks it how
 * many GPUs the process sees; without it (or without a driver) the answer is
 * 0 and cohort runs its CPU kernels.
 */
#include "gpu/gpu.h"

#ifdef COHORT_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

int gpu_cuda_built(void)
{
#ifdef COHORT_HAVE_CUDA
    return 1;
#else
    return 0;
#endif
}

int gpu_device_count(void)
{
#ifdef COHORT_HAVE_CUDA
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
    return n;
#else
    return 0;
#endif
}

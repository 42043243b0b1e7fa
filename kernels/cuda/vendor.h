/*
** vendor.h — the CUDA and HIP runtime names side by side, so kernels/cuda/cuda.cu compiles for
** NVIDIA (nvcc, -arch=sm_90a) and AMD (hipcc, --offload-arch=gfx90a) from one text.
**
** The kernels use nothing that differs between the two beyond these names: no warp shuffles (so
** no warp-size assumption: reductions go through shared memory in a fixed tree), no vendor fp8
** or bf16 types (kernels/lowp.h does the conversions in integer arithmetic), no vendor BLAS.
** The one exception is NVIDIA's tensor-core GEMM tile (inline PTX: ldmatrix, mma.sync), compiled
** only without ST_HIP; the hip build runs the fp32 tile for every weight.
*/
#ifndef ST_CUDA_VENDOR_H
#define ST_CUDA_VENDOR_H

#if defined(ST_HIP)
#include <hip/hip_runtime.h>

#define ST_GPU_VENDOR "hip"
typedef hipError_t gpuError_t;
typedef hipStream_t gpuStream_t;
typedef hipDeviceProp_t gpuDeviceProp;
#define gpuSuccess hipSuccess
#define gpuGetErrorString hipGetErrorString
#define gpuGetLastError hipGetLastError
#define gpuGetDeviceCount hipGetDeviceCount
#define gpuSetDevice hipSetDevice
#define gpuGetDeviceProperties hipGetDeviceProperties
#define gpuStreamCreateWithFlags hipStreamCreateWithFlags
#define gpuStreamNonBlocking hipStreamNonBlocking
#define gpuStreamDestroy hipStreamDestroy
#define gpuStreamSynchronize hipStreamSynchronize
#define gpuMalloc hipMalloc
#define gpuFree hipFree
#define gpuMallocHost(p, bytes) hipHostMalloc(p, bytes, 0)
#define gpuFreeHost hipHostFree
#define gpuMemsetAsync hipMemsetAsync
#define gpuMemcpyAsync hipMemcpyAsync
#define gpuMemcpyHostToDevice hipMemcpyHostToDevice
#define gpuMemcpyDeviceToHost hipMemcpyDeviceToHost
#define gpuMemcpyDeviceToDevice hipMemcpyDeviceToDevice
#define gpuFuncSetAttribute(f, a, v) hipFuncSetAttribute((const void *)(f), a, v)
#define gpuFuncAttributeMaxDynamicSharedMemorySize hipFuncAttributeMaxDynamicSharedMemorySize
typedef hipEvent_t gpuEvent_t;
#define gpuEventCreate hipEventCreate
#define gpuEventDestroy hipEventDestroy
#define gpuEventRecord hipEventRecord
#define gpuEventSynchronize hipEventSynchronize
#define gpuEventElapsedTime hipEventElapsedTime
#else
#include <cuda_runtime.h>

#define ST_GPU_VENDOR "cuda"
typedef cudaError_t gpuError_t;
typedef cudaStream_t gpuStream_t;
typedef cudaDeviceProp gpuDeviceProp;
#define gpuSuccess cudaSuccess
#define gpuGetErrorString cudaGetErrorString
#define gpuGetLastError cudaGetLastError
#define gpuGetDeviceCount cudaGetDeviceCount
#define gpuSetDevice cudaSetDevice
#define gpuGetDeviceProperties cudaGetDeviceProperties
#define gpuStreamCreateWithFlags cudaStreamCreateWithFlags
#define gpuStreamNonBlocking cudaStreamNonBlocking
#define gpuStreamDestroy cudaStreamDestroy
#define gpuStreamSynchronize cudaStreamSynchronize
#define gpuMalloc cudaMalloc
#define gpuFree cudaFree
#define gpuMallocHost(p, bytes) cudaMallocHost(p, bytes)
#define gpuFreeHost cudaFreeHost
#define gpuMemsetAsync cudaMemsetAsync
#define gpuMemcpyAsync cudaMemcpyAsync
#define gpuMemcpyHostToDevice cudaMemcpyHostToDevice
#define gpuMemcpyDeviceToHost cudaMemcpyDeviceToHost
#define gpuMemcpyDeviceToDevice cudaMemcpyDeviceToDevice
#define gpuFuncSetAttribute(f, a, v) cudaFuncSetAttribute(f, a, v)
#define gpuFuncAttributeMaxDynamicSharedMemorySize cudaFuncAttributeMaxDynamicSharedMemorySize
typedef cudaEvent_t gpuEvent_t;
#define gpuEventCreate cudaEventCreate
#define gpuEventDestroy cudaEventDestroy
#define gpuEventRecord cudaEventRecord
#define gpuEventSynchronize cudaEventSynchronize
#define gpuEventElapsedTime cudaEventElapsedTime
#endif

#endif

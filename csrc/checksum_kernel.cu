// The checksum of offloaded memory, computed on the GPU where the bytes are
// (checksum.h has the definition): the sum over the 64-bit words w[i] of
// [p, p + 8n) of w[i] * (((i ^ seed) << 1) | 1), modulo 2^64, added into
// *out (zeroed by the caller).  csrc/checksum_ptx.c is this file as PTX,
// made by tools/gen_ptx.py; the CUDA backend loads it with the driver API.
extern "C" __global__ void gp_checksum_kernel(const unsigned long long *p, unsigned long long n,
                                              unsigned long long seed, unsigned long long *out)
{
    unsigned long long acc = 0;
    unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        acc += p[i] * (((i ^ seed) << 1) | 1ull);
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_down_sync(0xffffffffu, acc, o);
    if ((threadIdx.x & 31) == 0) atomicAdd(out, acc);
}

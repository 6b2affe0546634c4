// The CUDA backend's own kernels, for offload; csrc/kernels_ptx.c is this
// file as PTX, made by tools/gen_ptx.py, and backend_cuda.c loads it with
// the driver API.

// The checksum of offloaded memory (checksum.h has the definition, and
// checksum.c the same terms on the host): the sum over the 64-bit words
// w[i] of [p, p + 8n) of mix(w[i] ^ (i ^ seed) * K), modulo 2^64, added into
// *out (zeroed by gp_zero_kernel).
extern "C" __global__ void gp_checksum_kernel(const unsigned long long *p, unsigned long long n,
                                              unsigned long long seed, unsigned long long *out)
{
    unsigned long long acc = 0;
    unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        unsigned long long x = p[i] ^ (i ^ seed) * 0x9e3779b97f4a7c15ull;
        x ^= x >> 33;
        x *= 0xff51afd7ed558ccdull;
        x ^= x >> 33;
        x *= 0xc4ceb9fe1a85ec53ull;
        acc += x ^ x >> 33;
    }
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_down_sync(0xffffffffu, acc, o);
    if ((threadIdx.x & 31) == 0) atomicAdd(out, acc);
}

// The checksum's accumulator, zeroed in stream order.
extern "C" __global__ void gp_zero_kernel(unsigned long long *out) { *out = 0; }

// The backend's gather (backend.h): range b = blockIdx.x, srcs[b] for
// lens[b] bytes (none when above max_len), goes to dst at the sum of the
// earlier ranges' lengths, each rounded up to `align` (a power of two); the
// blocks of one range (blockIdx.y) copy parts of it.  The arrays are read
// here, on the device, as the work that wrote them (a compression) left them.
extern "C" __global__ void gp_gather_kernel(unsigned char *dst, const unsigned char *const *srcs,
                                            const unsigned long long *lens, unsigned long long align,
                                            unsigned long long max_len)
{
    // The offset: the block's threads sum the earlier ranges between them
    // (a batch holds up to thousands of ranges).
    __shared__ unsigned long long warp_sums[32];
    unsigned int b = blockIdx.x;
    unsigned long long o = 0;
    for (unsigned int i = threadIdx.x; i < b; i += blockDim.x) {
        unsigned long long l = lens[i];
        o += l > max_len ? 0 : (l + align - 1) & ~(align - 1);
    }
    for (int k = 16; k > 0; k >>= 1) o += __shfl_down_sync(0xffffffffu, o, k);
    if ((threadIdx.x & 31) == 0) warp_sums[threadIdx.x >> 5] = o;
    __syncthreads();
    unsigned long long off = 0;
    for (unsigned int w = 0; w < (blockDim.x + 31) / 32; w++) off += warp_sums[w];
    unsigned long long len = lens[b];
    if (len > max_len) return;
    const unsigned char *s = srcs[b];
    unsigned char *d = dst + off;
    // This block's part, in 16-byte units where both ends allow.
    unsigned long long part = ((len + gridDim.y - 1) / gridDim.y + 15) & ~15ull;
    unsigned long long lo = part * blockIdx.y, hi = lo + part < len ? lo + part : len;
    if (lo >= hi) return;
    if ((((unsigned long long)s | (unsigned long long)d) & 15) == 0) {
        unsigned long long n16 = (hi - lo) / 16;
        const uint4 *s4 = (const uint4 *)(s + lo);
        uint4 *d4 = (uint4 *)(d + lo);
        for (unsigned long long i = threadIdx.x; i < n16; i += blockDim.x) d4[i] = s4[i];
        lo += n16 * 16;
    }
    for (unsigned long long i = lo + threadIdx.x; i < hi; i += blockDim.x) d[i] = s[i];
}

// The backend's copies marked GP_COPY_BY_KERNEL (backend.h): n bytes, one
// side pinned host memory that the device reaches over the bus.
extern "C" __global__ void gp_copy_kernel(unsigned char *dst, const unsigned char *src, unsigned long long n)
{
    unsigned long long t = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x, lo = 0;
    if ((((unsigned long long)dst | (unsigned long long)src) & 7) == 0) {
        for (unsigned long long i = t; i < n / 8; i += stride)
            ((unsigned long long *)dst)[i] = ((const unsigned long long *)src)[i];
        lo = n / 8 * 8;
    }
    for (unsigned long long i = lo + t; i < n; i += stride) dst[i] = src[i];
}

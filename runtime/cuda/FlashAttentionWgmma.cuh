//===- FlashAttentionWgmma.cuh - Hopper warpgroup MMA for flash attention -*- CUDA -*-===//
//
// wgmma (sm_90a) products and the shared-memory tiles they read, for the
// flash attention kernels in FlashAttentionHopper.cu. Compile for sm_90a only
// (-gencode=arch=compute_90a,code=sm_90a): plain sm_90 rejects wgmma.
//
// A warpgroup (4 consecutive warps, the first warp index a multiple of 4)
// computes a 64 x N product; its fp32 accumulators sit in registers in the
// layout of 4 stacked mma.m16n8k16 C fragments: warp w of the group holds
// rows 16w .. 16w + 15, and d[nb][x] of lane l (g = l / 4, t = l % 4) is
// row 16w + g + 8 (x / 2), column 8 nb + 2t + x % 2. The A operand from
// registers has the m16n8k16 A layout per warp, so two adjacent 8-column
// blocks of a score accumulator, rounded to bf16, are the A operand of the
// 16-wide k-step they span (FlashAttention-3's register reuse), exactly as
// FlashAttentionTiles.cuh does it for mma.sync.
//
// Tiles: a [rows, D] bf16 tile is D / 64 column blocks of [rows, 64], each
// row 128 bytes, the 16-byte chunks of row r XOR-swizzled by r % 8 (the
// 128-byte swizzle wgmma's descriptors name), every block 1024-byte aligned.
// One layout serves both operand orders: read "K-major" (rows are M or N,
// the 64 columns K) for A = Q and B = K in S = Q K^T, and "MN-major" (rows
// are K, columns N) for B = V in O += P V, so V needs no transpose.
//
//===----------------------------------------------------------------------===//
#ifndef MHCC_RUNTIME_CUDA_FLASHATTENTIONWGMMA_CUH
#define MHCC_RUNTIME_CUDA_FLASHATTENTIONWGMMA_CUH

#include "runtime/cuda/FlashAttentionTiles.cuh"

#include <cuda.h> // CUtensorMap

namespace mhcc::runtime::cuda::flash::wg {

/// Byte offset of element (row, col) in a swizzled [kRows, D] tile.
template <int kRows> __device__ __forceinline__ uint32_t tileOffset(int row, int col) {
  return uint32_t((col >> 6) * (kRows * 128) + row * 128 + ((((col >> 3) & 7) ^ (row & 7)) << 4) + (col & 7) * 2);
}

/// Starts copying `rows` rows (the first `valid` real, the rest zeros) of D bf16, `ld` apart in global memory,
/// into a swizzled tile at shared address `tile`; 16 bytes per cp.async, consecutive threads on consecutive chunks.
template <int D, int kRows, int kThreadsLoading>
__device__ __forceinline__ void loadTile(uint32_t tile, const bf16 *src, int64_t ld, int valid, int tid) {
  constexpr int kChunksPerRow = D / 8, kChunks = kRows * kChunksPerRow;
  static_assert(kChunks % kThreadsLoading == 0, "tile chunks must split evenly over the threads");
#pragma unroll
  for (int i = 0; i < kChunks / kThreadsLoading; ++i) {
    const int c = tid + i * kThreadsLoading, row = c / kChunksPerRow, col = (c % kChunksPerRow) * 8;
    const bool ok = row < valid;
    cpAsync16(tile + tileOffset<kRows>(row, col), ok ? src + row * ld + col : src, ok);
  }
}

/// Shared-memory matrix descriptor (PTX ISA, "Matrix Descriptor Format"): start address, leading and stride byte
/// offsets (all >> 4), 128-byte swizzle.
__device__ __forceinline__ uint64_t descriptor(uint32_t addr, uint32_t leading, uint32_t stride) {
  return uint64_t((addr & 0x3FFFF) >> 4) | (uint64_t(leading >> 4) << 16) | (uint64_t(stride >> 4) << 32) |
         (1ull << 62);
}

/// A or B read K-major: rows from `row0` of a [kRows, D] tile, the 16 columns from k0 (a multiple of 16). Eight
/// rows are 1024 bytes apart; the leading offset is unused with this swizzle.
template <int kRows> __device__ __forceinline__ uint64_t kMajor(uint32_t tile, int row0, int k0) {
  return descriptor(tile + uint32_t((k0 >> 6) * (kRows * 128) + row0 * 128 + (k0 & 63) * 2), 16, 1024);
}

/// B read MN-major: the 16 rows from k0 of a [kRows, D] tile are K, all D columns are N: 64-column blocks
/// kRows * 128 bytes apart (leading), groups of 8 rows 1024 apart (stride).
template <int kRows> __device__ __forceinline__ uint64_t mnMajor(uint32_t tile, int k0) {
  return descriptor(tile + uint32_t(k0 * 128), kRows * 128, 1024);
}

/// Orders this thread's register and shared-memory accesses before the warpgroup's next wgmma.
__device__ __forceinline__ void fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
/// Returns once at most N of the warpgroup's committed groups are in flight.
template <int N> __device__ __forceinline__ void wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
/// Makes this thread's generic-proxy shared-memory writes (cp.async, st.shared) visible to wgmma's reads.
__device__ __forceinline__ void fenceProxyAsync() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

/// Keeps the compiler from moving accesses of an accumulator across the asynchronous products.
template <int N> __device__ __forceinline__ void pin(float (&d)[N / 8][4]) {
#pragma unroll
  for (int nb = 0; nb < N / 8; ++nb)
#pragma unroll
    for (int x = 0; x < 4; ++x)
      asm volatile("" : "+f"(d[nb][x])::"memory");
}

/// d (64 x N) = A B^T (+ d when accumulate), k = 16: A and B descriptors read K-major.
template <int N> __device__ void wgmmaSS(float (&d)[N / 8][4], uint64_t a, uint64_t b, int accumulate);
/// d (64 x N) = A B (+ d when accumulate), k = 16: A from registers (m16n8k16 A fragments), B read MN-major.
template <int N> __device__ void wgmmaRS(float (&d)[N / 8][4], const uint32_t (&a)[4], uint64_t b, int accumulate);

template <> __device__ __forceinline__ void wgmmaSS<64>(float (&d)[64 / 8][4], uint64_t a, uint64_t b, int accumulate) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
               "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
               : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
                 "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
                 "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
                 "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
               : "l"(a), "l"(b), "r"(accumulate));
}

template <> __device__ __forceinline__ void wgmmaSS<128>(float (&d)[128 / 8][4], uint64_t a, uint64_t b, int accumulate) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
               "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
               "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
               "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
               : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
                 "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
                 "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
                 "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]),
                 "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]),
                 "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]),
                 "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]),
                 "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
               : "l"(a), "l"(b), "r"(accumulate));
}

template <> __device__ __forceinline__ void wgmmaRS<64>(float (&d)[64 / 8][4], const uint32_t (&a)[4], uint64_t b, int accumulate) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
               "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
               : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
                 "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
                 "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
                 "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate));
}

template <> __device__ __forceinline__ void wgmmaRS<128>(float (&d)[128 / 8][4], const uint32_t (&a)[4], uint64_t b, int accumulate) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
               "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
               "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
               "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
               : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
                 "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
                 "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
                 "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]),
                 "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]),
                 "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]),
                 "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]),
                 "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate));
}

} // namespace mhcc::runtime::cuda::flash::wg

/// Loads through the tensor memory accelerator: one thread names a [kBoxRows, 64 columns] box of a bf16 matrix
/// and the TMA unit writes it into shared memory with the 128-byte swizzle the wgmma descriptors read (the tile
/// layout above), completing a transaction count on an mbarrier. Consumers wait on that barrier's phase and
/// release a buffer by arriving on its "empty" barrier once their products have read it.
namespace mhcc::runtime::cuda::flash::tma {

/// `rows` x `cols` row-major bf16 at `base` (16-byte aligned, cols a multiple of 8) as a tensor map of
/// [boxRows, 64] boxes with the 128-byte swizzle; rows past the matrix read as zeros. "" or the error.
std::string tensorMap(CUtensorMap &map, const bf16 *base, int64_t cols, int64_t rows, int boxRows);

__device__ __forceinline__ void init(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
/// Makes the initialized barriers visible to the async proxy (the TMA unit); then a block barrier.
__device__ __forceinline__ void fenceInit() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
/// One arrival that also expects `bytes` more of transactions in this phase.
__device__ __forceinline__ void expectBytes(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
/// Returns once the barrier's phase `parity` has completed.
__device__ __forceinline__ void wait(uint32_t bar, uint32_t parity) {
  asm volatile("{\n.reg .pred done;\nWAIT:\n"
               "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
               "@!done bra WAIT;\n}\n" ::"r"(bar),
               "r"(parity)
               : "memory");
}
/// The box at (column col, row row) of the map's matrix into shared memory at dst.
__device__ __forceinline__ void loadBox(uint32_t dst, const CUtensorMap &map, int col, int row, uint32_t bar) {
  asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], "
               "[%4];\n" ::"r"(dst),
               "l"(reinterpret_cast<uint64_t>(&map)), "r"(col), "r"(row), "r"(bar)
               : "memory");
}
/// A [kRows, D] tile at (col, row) in kBoxRows-row boxes (the map's), kRows * D * 2 bytes on `bar`.
template <int D, int kRows, int kBoxRows>
__device__ __forceinline__ void loadTile(uint32_t dst, const CUtensorMap &map, int col, int row, uint32_t bar) {
  static_assert(kRows % kBoxRows == 0 && kBoxRows % 8 == 0, "whole boxes of whole swizzle periods");
#pragma unroll
  for (int c = 0; c < D / 64; ++c)
#pragma unroll
    for (int r = 0; r < kRows / kBoxRows; ++r)
      loadBox(dst + uint32_t(c * kRows * 128 + r * kBoxRows * 128), map, col + 64 * c, row + r * kBoxRows, bar);
}
/// Warp-specialized blocks: warpgroups 0 and 1 compute, warpgroup 2 loads; setmaxnreg moves registers from the
/// loading warpgroup to the computing ones (40 + 2 x 232 per lane of the 64K-register file).
constexpr int kSpecializedThreads = 384, kLoaderRegisters = 40, kComputeRegisters = 232;
/// Registers a warpgroup keeps: the loading one gives most away to the two computing ones.
template <int N> __device__ __forceinline__ void keepRegisters() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N) : "memory");
}
template <int N> __device__ __forceinline__ void takeRegisters() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N) : "memory");
}

} // namespace mhcc::runtime::cuda::flash::tma

#endif // MHCC_RUNTIME_CUDA_FLASHATTENTIONWGMMA_CUH

//===- ModelKernels.h - the artifact's generated CUDA kernels ------*- C++ -*-===//
//
// mhcc compiles the model's non-GEMM kernels (runtime/cuda/ModelKernels.cu
// and the parts after it, specialized to the model's stream count and Sinkhorn iterations) into a
// cubin inside the artifact. This loads that image on one device through the
// CUDA driver API (entry points resolved through the runtime, so nothing links
// libcuda) and launches its kernels by name. One instance per device: a module
// belongs to the context it was loaded in.
//
//===----------------------------------------------------------------------===//
#ifndef MHCC_RUNTIME_CUDA_MODELKERNELS_H
#define MHCC_RUNTIME_CUDA_MODELKERNELS_H

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>

typedef struct CUstream_st *cudaStream_t;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;

namespace mhcc::runtime {
struct DeviceCode;
}

namespace mhcc::runtime::cuda {

/// The image's kernels, by their extern "C" names; parameter lists are in
/// runtime/cuda/{ModelKernels,MhcKernels,MhcMixKernels,MhcFusedKernels,MhcBackwardKernels,
/// LayerKernels,TensorParallelKernels}.cu.
#define MHCC_MODEL_KERNELS(X)                                                                     \
  X(RowSquares, "mhcc_row_squares")                                                               \
  X(EmbedForward, "mhcc_embed_forward")                                                           \
  X(EmbedBackward, "mhcc_embed_backward")                                                         \
  X(ExpandForward, "mhcc_expand_forward")                                                         \
  X(ExpandBackward, "mhcc_expand_backward")                                                       \
  X(ContractForward, "mhcc_contract_forward")                                                     \
  X(ContractBackward, "mhcc_contract_backward")                                                   \
  X(MhcCoeffsForward, "mhcc_mhc_coeffs_forward")                                                  \
  X(MhcCoeffsBackward, "mhcc_mhc_coeffs_backward")                                                \
  X(MhcBiasGradPartials, "mhcc_mhc_bias_grad_partials")                                           \
  X(MhcAlphaGradPartials, "mhcc_mhc_alpha_grad_partials")                                         \
  X(MhcGateGradPartials, "mhcc_mhc_gate_grad_partials")                                           \
  X(MhcCoeffsBackwardInput, "mhcc_mhc_coeffs_backward_input")                                     \
  X(RowScaleAdd, "mhcc_row_scale_add")                                                            \
  X(MhcPreForward, "mhcc_mhc_pre_forward")                                                        \
  X(MhcCoeffsPreForward, "mhcc_mhc_coeffs_pre_forward")                                           \
  X(MhcPostResCoeffsPreForward, "mhcc_mhc_post_res_coeffs_pre_forward")                           \
  X(MhcPostResCoeffsPreForwardCluster, "mhcc_mhc_post_res_coeffs_pre_forward_cluster")            \
  X(MhcPreBackward, "mhcc_mhc_pre_backward")                                                      \
  X(MhcPostResForward, "mhcc_mhc_post_res_forward")                                               \
  X(MhcPostResBackward, "mhcc_mhc_post_res_backward")                                              \
  X(MhcPostBackward, "mhcc_mhc_post_backward")                                                    \
  X(MhcMixBackwardDots, "mhcc_mhc_mix_backward_dots")                                             \
  X(MhcMixBackwardInput, "mhcc_mhc_mix_backward_input")                                           \
  X(MhcMixBackwardInputPost, "mhcc_mhc_mix_backward_input_post")                                  \
  X(ResidualForward, "mhcc_residual_forward")                                                     \
  X(ResidualBackward, "mhcc_residual_backward")                                                   \
  X(RmsNormForward, "mhcc_rms_norm_forward")                                                      \
  X(RmsNormBackwardRow, "mhcc_rms_norm_backward_row")                                             \
  X(RmsNormGainGradPartials, "mhcc_rms_norm_gain_grad_partials")                                  \
  X(Rope, "mhcc_rope")                                                                            \
  X(RopeTable, "mhcc_rope_table")                                                                 \
  X(CausalSoftmax, "mhcc_causal_softmax")                                                         \
  X(CausalSoftmaxBackward, "mhcc_causal_softmax_backward")                                        \
  X(SwigluGate, "mhcc_swiglu_gate")                                                               \
  X(SwigluBackwardGate, "mhcc_swiglu_backward_gate")                                              \
  X(LogSumExp, "mhcc_log_sum_exp")                                                                \
  X(Loss, "mhcc_loss")                                                                            \
  X(CrossEntropyBackward, "mhcc_cross_entropy_backward")                                         \
  X(ShareRowMax, "mhcc_share_row_max")                                                            \
  X(ShareRowSumExp, "mhcc_share_row_sum_exp")                                                     \
  X(ShareLoss, "mhcc_share_loss")

enum class ModelKernel : int {
#define MHCC_KERNEL_ENUM(id, name) id,
  MHCC_MODEL_KERNELS(MHCC_KERNEL_ENUM)
#undef MHCC_KERNEL_ENUM
      Count
};

/// Launch conventions the image must agree with (its mhcc_abi_* globals).
inline constexpr int kModelKernelsAbi = 19;
inline constexpr int kBlockThreads = 256;
inline constexpr int64_t kColumnChunkRows = 64;
/// mhcc_mhc_coeffs_backward_input's tiles: a block of 2 warps takes 32 tokens x 64 columns.
inline constexpr int kInputGradColumns = 64, kInputGradTokens = 32, kInputGradThreads = 64;
/// mhcc_mhc_mix_backward_input's: a block of 128 threads takes 16 tokens x
/// 64 columns c of every stream (up to n = kMixMaxStreams: a warp a stream).
inline constexpr int kMixColumns = 64, kMixTokens = 16, kMixThreads = 128, kMixMaxStreams = 4;
/// mhcc_mhc_coeffs_pre_forward's tiles: a block takes 16 tokens, with 16
/// warps up to n = 4 and 8 beyond (MhcFusedKernels.cu: its shared stages).
inline constexpr int kFusedTokens = 16;
inline constexpr int fusedWarps(int64_t streams) { return (streams * streams + 2 * streams) / 8 <= 5 ? 16 : 8; }
/// mhcc_mhc_post_res_coeffs_pre_forward_cluster's: a cluster of 4 blocks
/// takes those 16 tokens, each block a quarter of the warps' walk and its
/// quarter of the x' tile in dynamic shared memory (up to kClusterTileBytes).
inline constexpr int kClusterBlocks = 4, kClusterTilePad = 64;
inline constexpr int64_t kClusterTileBytes = 96 * 1024;

class ModelKernels {
public:
  /// Loads `code` into the current device's context. `activationBytes` and
  /// `residualBytes` are the model's activation and residual-stream storage
  /// sizes (2 for bf16, 4 for fp32); the image must have been compiled for
  /// them. On failure, `error` is one line naming the device and the fix (a
  /// wrong GPU architecture, an image from another model or dtype, a driver
  /// that cannot load it).
  static std::unique_ptr<ModelKernels> load(const DeviceCode &code, int device, int activationBytes,
                                            int residualBytes, std::string &error);
  ~ModelKernels();
  ModelKernels(const ModelKernels &) = delete;
  ModelKernels &operator=(const ModelKernels &) = delete;

  /// Arguments must have exactly the kernel's parameter types (int64_t
  /// sizes, float scalars, int flags, pointers).
  template <typename... Args>
  void launch(ModelKernel kernel, unsigned gridX, unsigned gridY, unsigned block, cudaStream_t stream,
              Args... args) const {
    void *params[] = {static_cast<void *>(&args)..., nullptr};
    launchRaw(kernel, gridX, gridY, block, 0, stream, params);
  }
  /// launch, with `sharedBytes` of dynamic shared memory (up to
  /// kClusterTileBytes; only the cluster kernel takes any).
  template <typename... Args>
  void launchShared(ModelKernel kernel, unsigned gridX, unsigned block, unsigned sharedBytes, cudaStream_t stream,
                    Args... args) const {
    void *params[] = {static_cast<void *>(&args)..., nullptr};
    launchRaw(kernel, gridX, 1, block, sharedBytes, stream, params);
  }

  /// "" or the first failed launch since the last call (then cleared).
  std::string takeError() const;

  /// Whether the cluster kernel got its dynamic shared memory at load
  /// (launchShared's kClusterTileBytes); if not, mhcPostResCoeffsPreForward
  /// keeps to one block a tile.
  bool clusterForwardReady() const { return clusterForwardReady_; }

  /// mhcc_rope's rotations for sequences of `seq` tokens and head dim `d`
  /// ([seq x d / 2] (cos, sin) pairs of floats), made on `stream` the first
  /// time they are asked for and kept with the module; null if out of
  /// memory.
  const float *ropeTable(int64_t seq, int64_t d, cudaStream_t stream) const;

private:
  ModelKernels() = default;
  void launchRaw(ModelKernel kernel, unsigned gridX, unsigned gridY, unsigned block, unsigned sharedBytes,
                 cudaStream_t stream, void **params) const;

  CUmodule module_ = nullptr;
  CUfunction functions_[int(ModelKernel::Count)] = {};
  mutable std::string firstError_;
  mutable std::map<std::pair<int64_t, int64_t>, float *> ropeTables_;
  bool clusterForwardReady_ = false;
};

} // namespace mhcc::runtime::cuda

#endif // MHCC_RUNTIME_CUDA_MODELKERNELS_H

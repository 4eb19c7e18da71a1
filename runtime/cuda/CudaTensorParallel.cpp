//===- CudaTensorParallel.cpp - the tensor-parallel group's collectives -----===//
//
// Megatron's tensor and sequence parallelism on the GPU (runtime/cpu/
// TensorParallel.h is the CPU's form of the same steps): the row-parallel
// products' partial sums are summed over the group (all-reduce), or under
// sequence parallelism the rows a column-parallel GEMM reads are gathered
// first (all-gather) and its partial sums reduced to each rank's rows
// (reduce-scatter). Every collective is checked against the schedule's
// COLLECTIVE instructions before it is issued.
//
// Under sequence parallelism a rank holds, of each sequence of the
// microbatch, its tensorRank-th share of the rows (runtime/cpu/
// CpuRankBase.h's sequenceRows); NCCL's gather and scatter are rank-major,
// so the rows are put into (and taken from) the microbatch's order with one
// strided copy per rank.
//
//===----------------------------------------------------------------------===//
#include "runtime/cuda/CudaRank.h"
#include "runtime/cuda/DeviceKernels.h"

namespace mhcc::runtime::cuda {

bool CudaRank::expectCollectives(const Instr *first, size_t count) {
  collectives_.expect(first, count);
  return true;
}

bool CudaRank::collectivesIssued() {
  const std::string problem = collectives_.finished();
  return problem.empty() || fail(problem);
}

bool CudaRank::interposeCollectives(const Instr *first, size_t count) {
  collectives_.interpose(first, count);
  return true;
}

bool CudaRank::resumeCollectives() {
  const std::string problem = collectives_.resume();
  return problem.empty() || fail(problem);
}

bool CudaRank::tensorAllReduce(void *data, int64_t count, Dtype dtype, bool max) {
  if (std::string problem = collectives_.issue(MeshAxis::Tensor, max ? CollectiveOp::AllReduceMax : CollectiveOp::AllReduce,
                                               count, 1);
      !problem.empty())
    return fail(problem);
  if (std::string problem = links_->allReduceTensor(data, count, dtype, max, compute_); !problem.empty())
    return fail("a tensor-parallel all-reduce: " + problem);
  return true;
}

namespace {

/// Copies rows between the rank-major order (rank t's rows together: its
/// share of each of `sequences` sequences in turn) and the microbatch's,
/// `rowBytes` a row: one 2D copy a rank (a share of each sequence a step).
void permuteRows(const void *from, void *to, int64_t tp, int64_t share, int64_t seq, int64_t sequences,
                 int64_t rowBytes, bool toMicrobatch, cudaStream_t stream) {
  char *rankMajor = static_cast<char *>(const_cast<void *>(toMicrobatch ? from : to));
  char *ordered = static_cast<char *>(const_cast<void *>(toMicrobatch ? to : from));
  const int64_t shareBytes = share * rowBytes;
  for (int64_t t = 0; t < tp; ++t)
    copySequenceRun(rankMajor + t * sequences * shareBytes, shareBytes, ordered, t * shareBytes, seq * rowBytes,
                    shareBytes, sequences, toMicrobatch, stream);
}

} // namespace

template <typename A> const A *CudaRank::allRows(const A *local, int64_t cols) {
  if (!a_.sequenceParallel)
    return local;
  if (std::string problem = collectives_.issue(MeshAxis::Tensor, CollectiveOp::AllGather, rows_, cols);
      !problem.empty()) {
    fail(problem);
    return nullptr;
  }
  A *rankMajor = scratchOf<A>(gemmRows_ * cols), *all = scratchOf<A>(gemmRows_ * cols);
  if (std::string problem = links_->allGatherTensor(local, rankMajor, rows_ * cols, kActivations<A>, compute_);
      !problem.empty()) {
    fail("a tensor-parallel all-gather: " + problem);
    return nullptr;
  }
  const int64_t seq = a_.model.seqLen / a_.cp, share = seq / a_.tp; // a context rank's rows a sequence
  permuteRows(rankMajor, all, a_.tp, share, seq, gemmRows_ / seq, cols * int64_t(sizeof(A)), true, compute_);
  return all;
}

template <typename A> bool CudaRank::reducePartial(A *partial, A *out, int64_t cols, bool add) {
  if (!a_.sequenceParallel) {
    if (!tensorAllReduce(partial, gemmRows_ * cols, kActivations<A>))
      return false;
    if (add)
      addInto(out, static_cast<const A *>(partial), rows_ * cols, compute_);
    else if (out != partial)
      cudaMemcpyAsync(out, partial, rows_ * cols * sizeof(A), cudaMemcpyDeviceToDevice, compute_);
    return true;
  }
  if (std::string problem = collectives_.issue(MeshAxis::Tensor, CollectiveOp::ReduceScatter, rows_ * a_.tp, cols);
      !problem.empty())
    return fail(problem);
  A *rankMajor = scratchOf<A>(gemmRows_ * cols), *mine = add ? scratchOf<A>(rows_ * cols) : out;
  const int64_t seq = a_.model.seqLen / a_.cp, share = seq / a_.tp;
  permuteRows(partial, rankMajor, a_.tp, share, seq, gemmRows_ / seq, cols * int64_t(sizeof(A)), false, compute_);
  if (std::string problem = links_->reduceScatterTensor(rankMajor, mine, rows_ * cols, kActivations<A>, compute_);
      !problem.empty())
    return fail("a tensor-parallel reduce-scatter: " + problem);
  if (add)
    addInto(out, static_cast<const A *>(mine), rows_ * cols, compute_);
  return true;
}

template const float *CudaRank::allRows<float>(const float *, int64_t);
template const bf16 *CudaRank::allRows<bf16>(const bf16 *, int64_t);
template bool CudaRank::reducePartial<float>(float *, float *, int64_t, bool);
template bool CudaRank::reducePartial<bf16>(bf16 *, bf16 *, int64_t, bool);

} // namespace mhcc::runtime::cuda

//===- CudaState.cpp - a GPU rank's training state to and from the host -----===//
//
// The parameters for an export, and the weights and Adam moments a
// checkpoint saves and loads: by parameter, as ParameterState keeps them,
// whatever block (tensor parallelism) or part (the distributed optimizer)
// of each this rank holds.
//
//===----------------------------------------------------------------------===//
#include "runtime/cuda/CudaRank.h"

#include "runtime/cuda/DeviceKernels.h"
#include "runtime/train/ParamRemainders.h"
#include "runtime/train/Parameters.h"

#include <algorithm>
#include <cstring>
#include <vector>

namespace mhcc::runtime::cuda {

void CudaRank::downloadParameters(std::vector<std::vector<float>> &weights) {
  cudaSetDevice(gpu_);
  // Every member of the gradient group holds the same weights (member 0
  // speaks), or under partMasters_ its part of them.
  if (member_ != 0 && !partMasters_)
    return;
  for (size_t p = 0; p < a_.params.size(); ++p)
    if (plans_[p].owner == pipe_ && (weights_.count(int(p)) || remainders_.count(int(p))) && speaksFor(p)) {
      const auto [begin, end] = masterRange(p);
      std::vector<float> block(held(p));
      const std::vector<float> masters = downloadMasters(p);
      std::copy(masters.begin(), masters.end(), block.begin() + begin);
      scatterShardPart(a_.params[p], a_.tp, tensor_, block.data(), begin, end, weights[p]);
    }
}

std::vector<float> CudaRank::downloadMasters(size_t p) {
  const auto [begin, end] = masterRange(p);
  std::vector<float> masters(end - begin);
  if (end == begin)
    return masters;
  if (!keepRemainders_) {
    cudaMemcpy(masters.data(), weights_.at(int(p)), masters.size() * 4, cudaMemcpyDeviceToHost);
    return masters;
  }
  std::vector<uint16_t> copy(masters.size()), low(masters.size());
  cudaMemcpy(copy.data(), lowWeights_.at(int(p)) + begin, copy.size() * 2, cudaMemcpyDeviceToHost);
  cudaMemcpy(low.data(), remainders_.at(int(p)), low.size() * 2, cudaMemcpyDeviceToHost);
  for (size_t e = 0; e < masters.size(); ++e) {
    const uint32_t bits = joinMaster(copy[e], low[e]);
    std::memcpy(&masters[e], &bits, sizeof bits);
  }
  return masters;
}

// Between steps every queue is idle, so plain (synchronous) copies are
// ordered after the last update. The trainer calls these on its thread.
bool CudaRank::saveState(ParameterState &state) {
  cudaSetDevice(gpu_);
  // Every replica and context rank holds the same weights (member 0 of the
  // gradient group, replica 0's context rank 0, speaks for them); with the
  // distributed optimizer each member holds its part of the moments (and
  // under partMasters_ of the weights). Each tensor rank holds its blocks
  // (speaksFor). Each fills its pieces and names them (the checkpoint puts
  // them together, or with one process a rank writes them as they are).
  if (member_ != 0 && !sharded_)
    return true;
  for (size_t p = 0; p < a_.params.size(); ++p) {
    if (plans_[p].owner != pipe_ || !speaksFor(p))
      continue;
    const ParamInfo &info = a_.params[p];
    const auto [begin, end] = ownShard(p);
    std::vector<float> block(held(p));
    if (member_ == 0 || partMasters_) {
      const auto [masterBegin, masterEnd] = masterRange(p);
      if (masterEnd > masterBegin) {
        const std::vector<float> masters = downloadMasters(p);
        std::copy(masters.begin(), masters.end(), block.begin() + masterBegin);
        const TensorPiece piece{a_.tp, tensor_, masterBegin, masterEnd};
        scatterPiece(info, piece, block.data() + masterBegin, state.weights[p]);
        state.weightPieces[p].push_back(piece);
      }
    }
    if (end == begin)
      continue; // no part of the moments here (fewer elements than parts)
    const TensorPiece piece{a_.tp, tensor_, begin, end};
    std::fill(block.begin(), block.end(), 0.0f); // SGD keeps no moments: zeros, as the CPU backend's
    for (auto [moments, device] : {std::pair{&state.adamM[p], adamM_.count(int(p)) ? adamM_[int(p)] : nullptr},
                                   std::pair{&state.adamV[p], adamV_.count(int(p)) ? adamV_[int(p)] : nullptr}}) {
      if (device)
        cudaMemcpy(block.data() + begin, device, (end - begin) * 4, cudaMemcpyDeviceToHost);
      scatterPiece(info, piece, block.data() + begin, *moments);
    }
    state.momentPieces[p].push_back(piece);
  }
  return check("downloading the weights and moments for a checkpoint");
}

bool CudaRank::loadState(const ParameterState &state) {
  cudaSetDevice(gpu_);
  for (size_t p = 0; p < a_.params.size(); ++p) { // every holder's copy
    if (!std::binary_search(plans_[p].holders.begin(), plans_[p].holders.end(), pipe_))
      continue;
    const ParamInfo &info = a_.params[p];
    if (state.weights[p].size() != size_t(info.count()))
      return fail("the loaded state lacks parameter " + info.name);
    std::vector<float> block(held(p));
    gatherShard(info, a_.tp, tensor_, state.weights[p].data(), block.data());
    if (!uploadWeights(p, block))
      return false;
    if (plans_[p].owner != pipe_ || !adamM_.count(int(p)))
      continue;
    const auto [begin, end] = ownShard(p);
    for (auto [moments, device] :
         {std::pair{&state.adamM[p], adamM_[int(p)]}, std::pair{&state.adamV[p], adamV_[int(p)]}})
      if (moments->size() == size_t(info.count())) {
        gatherShard(info, a_.tp, tensor_, moments->data(), block.data());
        upload(device, block.data() + begin, (end - begin) * 4);
      }
  }
  refreshLowWeights();
  cudaStreamSynchronize(compute_); // loaded before any other stream reads it
  return check("uploading the weights and moments of a checkpoint");
}

void CudaRank::refreshLowWeights(bool receivedOnly) {
  if (copiesLead()) // the copies are what the update, the gather and the holders' messages write
    return;
  for (auto &[p, low] : lowWeights_)
    if (!receivedOnly || plans_[p].owner != pipe_)
      toBf16(weights_.at(p), low, held(p), compute_);
}

} // namespace mhcc::runtime::cuda

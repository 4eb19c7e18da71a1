//===- DeviceProfile.h - the rates the schedule simulator assumes -*- C++ -*-===//
//
// What one device achieves, per model unit kind (CostModel.h): forward and
// backward TFLOP/s counted with the cost model's FLOPs, so the time of a
// unit is its FLOPs over its rate, or, for the units the cost model gives no
// FLOPs (embedding, expand: memory moves), nanoseconds per token; the P2P
// link's bandwidth and latency; and the optimizer's time per parameter. `mhcrun --profile
// --device-profile-out FILE` measures one on the device it runs on (from the
// time of each kernel family, attributed to unit kinds); `mhcc
// --device-profile NAME|FILE` reads one. The built-in profiles are such
// measurements, recorded with their source.
//
// JSON (format "mhcc-device-profile-v1"):
//   {"format": ..., "name": "h200-bf16", "source": "...", "dtype": "bf16",
//    "units": {"attention": {"forward_tflops": F, "backward_tflops": B,
//                            "forward_overhead_us": o, "backward_overhead_us": p},
//              "expand": {"forward_ns_per_token": f, "backward_ns_per_token": b}, ...},
//   or, as mhcrun writes them, measured times that mhcc fits rates to:
//    "measured_on": {model sizes}, "unit_ms": {"attention": {"forward": ms,
//    "backward": ms}, ...} (one run; with "mhc", the residual mixing around
//    one sublayer, measured apart from the sublayers and MTP, whose times
//    then exclude it), or "measurements": [{"measured_on":
//    ..., "unit_ms": ...}, ...] (several models: time = a x FLOPs + b per
//    unit kind, least squares, so small and large models are both costed),
//    "default_tflops": R, "link_gbps": G, "link_latency_us": L,
//    "optimizer_ns_per_param": N, "shared_cores": K}
//
// "shared_cores" (the CPU backend): every rank of a run is a thread or a
// process of one host with K cores, so ranks computing at once beyond K
// share them (the simulator's processor sharing); absent or 0, each rank has
// a device of its own (GPUs).
//
//===----------------------------------------------------------------------===//
#ifndef MHCC_PASSES_DEVICEPROFILE_H
#define MHCC_PASSES_DEVICEPROFILE_H

#include "passes/CostModel.h"

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace mhcc {

/// A unit's rates: TFLOP/s where the cost model counts FLOPs, else time per
/// token (0 = not given), plus a fixed time per unit and microbatch (kernel
/// launches and the latency of small kernels, which dominate small models).
/// The backward is the whole of it (input and weight gradients).
struct UnitRates {
  double forwardTflops = 0, backwardTflops = 0;
  double forwardNsPerToken = 0, backwardNsPerToken = 0;
  double forwardOverheadUs = 0, backwardOverheadUs = 0;
};

struct DeviceProfile {
  std::string name = "nominal";
  std::string source; // where the numbers come from (a run, a date, a commit)
  std::string dtype;  // the compute dtype the rates were measured in ("" = any)
  std::map<UnitKind, UnitRates> units;
  double defaultTflops = 400; // units without a measured rate
  double linkGBps = 0;        // 0: communication is free
  double linkLatencyUs = 0;
  double optimizerNsPerParam = 0;
  int64_t sharedCores = 0; // the host's cores every rank shares; 0: a device per rank

  /// Milliseconds of a unit of `kind` over `tokens` tokens whose forward
  /// (backward) does `flops` FLOPs.
  double forwardMs(UnitKind kind, double flops, int64_t tokens) const;
  double backwardMs(UnitKind kind, double flops, int64_t tokens) const;
  /// The same for a unit's cost over `tokens` tokens (the backward doing
  /// twice the forward's FLOPs) on one of `tp` tensor-parallel ranks:
  /// where the profile measured the residual mixing apart ("mhc"), the
  /// unit's mixing is priced at that rate, once per mixing, and the rest at
  /// the unit's. A tensor-parallel rank does 1 / tp of a split unit's rest
  /// (splitByTensorParallelism: its GEMMs and heads) and all of the
  /// replicated work (the mixing, expand, contract, the final norm) unless
  /// sequence parallelism gives it tokens / tp of the rows; the embedding's
  /// masked lookup stays whole either way, and each unit's fixed overhead too.
  double forwardMs(const UnitCost &cost, int64_t tokens, int64_t tp = 1, bool sequenceParallel = false) const;
  double backwardMs(const UnitCost &cost, int64_t tokens, int64_t tp = 1, bool sequenceParallel = false) const;
  /// "device profile h200-bf16 (SOURCE)", or the nominal rates.
  std::string describe() const;
};

/// A flat rate for every unit (mhcc's --sim-tflops / --sim-link-gbps).
DeviceProfile nominalProfile(double tflops, double linkGBps);

/// The built-in profiles, by name: "h200-bf16", "h200-fp32", "cpu".
std::optional<DeviceProfile> builtinDeviceProfile(const std::string &name);
std::vector<std::string> builtinDeviceProfileNames();

/// Reads and checks a profile (every rate finite and positive, known unit
/// names); on failure `error` says what is wrong, and where.
std::optional<DeviceProfile> parseDeviceProfile(const std::string &json, std::string &error);
/// A built-in name, else a file.
std::optional<DeviceProfile> loadDeviceProfile(const std::string &nameOrPath, std::string &error);
/// The JSON form parseDeviceProfile reads.
std::string formatDeviceProfile(const DeviceProfile &profile);

} // namespace mhcc

#endif // MHCC_PASSES_DEVICEPROFILE_H

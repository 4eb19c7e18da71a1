//===- MeasuredProfile.h - a device profile from mhcrun --profile -*- C++ -*-===//
//
// `mhcrun --profile --device-profile-out FILE` writes what this run measured,
// in the form mhcc --device-profile reads (passes/DeviceProfile.h): each
// kernel family's (primitive's) time per call, composed into the model's unit
// kinds as compiler/Lowering.cpp builds them (an attention sublayer is
// rms_norm + attention, the residual mixing around each sublayer is the
// "mhc" unit: mhc_coeffs + mhc_pre + mhc_post_res, or the residual add), as
// milliseconds per unit and microbatch, with the model's sizes; mhcc turns
// them into rates with its cost model (the runtime does not link it).
// Per-call times are means over the calls of a primitive: the calls of one
// primitive have one shape in these models, whichever unit makes them.
//
//===----------------------------------------------------------------------===//
#ifndef MHCC_RUNTIME_CLI_MEASUREDPROFILE_H
#define MHCC_RUNTIME_CLI_MEASUREDPROFILE_H

#include "runtime/artifact/Artifact.h"
#include "runtime/program/Trace.h"

#include <map>
#include <optional>
#include <string>

namespace mhcc::runtime {

/// The profile's JSON text from `profileMs` (the per-"rank R
/// fwd|bwd|bwd-weight PRIM" and "host: ..." milliseconds of `iterations`
/// steps); nullopt and `error` when the artifact's kernels do not compose
/// into its units as the lowering builds them (a lowering change this code
/// has not followed).
/// `sharedCores`: the host's cores when every rank ran on it (the CPU
/// backend; 0 on GPUs), recorded as the profile's "shared_cores".
std::optional<std::string> measuredDeviceProfile(const Artifact &artifact,
                                                 const std::map<std::string, double> &profileMs,
                                                 int64_t iterations, const std::string &name,
                                                 const std::string &source, int64_t sharedCores,
                                                 std::string &error);

/// "mhcrun: measured step ... bubble fraction ...; predicted ..." from the
/// same profile times: the step's wall time (the pipeline and the optimizer),
/// and each profiled rank's busy time (its primitives and the optimizer), so
/// the bubble is idle / (ranks x step) as mhcc's simulator defines it; the
/// artifact's prediction beside it when it has one.
std::string measuredStepLine(const Artifact &artifact, const std::map<std::string, double> &profileMs,
                             int64_t iterations);

/// "mhcrun: traced step ... bubble ...; predicted ..." from --trace's slices
/// (Trace.h's stepTimings: the medians over the steps after the first, or
/// the one step): unlike --profile's, nothing is timed inside an
/// instruction, so the step runs as it does untraced.
std::string tracedStepLine(const Artifact &artifact, const std::vector<TraceSlice> &slices);

} // namespace mhcc::runtime

#endif // MHCC_RUNTIME_CLI_MEASUREDPROFILE_H

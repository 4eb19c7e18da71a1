//===- Lowering.h - partitioned mhc IR -> artifact ------------------*- C++ -*-===//
//
// The serialize phase: lowers each virtual stage of a scheduled module into
// a forward stage program of kernel calls, differentiates it (compile-time
// autodiff), and packs programs, parameter table, schedule and IR into the
// artifact the runtime executes.
//
//===----------------------------------------------------------------------===//
#ifndef MHCC_COMPILER_LOWERING_H
#define MHCC_COMPILER_LOWERING_H

#include "runtime/artifact/Artifact.h"
#include "mlir/IR/BuiltinOps.h"

namespace mhcc {

/// Fails with a diagnostic on the module if it has not been scheduled.
mlir::FailureOr<runtime::Artifact> buildArtifact(mlir::ModuleOp module, llvm::StringRef modelHash);

/// Human-readable stage programs (forward and backward), for --emit=programs.
std::string formatPrograms(const runtime::Artifact &artifact);

} // namespace mhcc

#endif // MHCC_COMPILER_LOWERING_H

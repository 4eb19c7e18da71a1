//===- Version.h - the version line of mhcc's tools ---------------*- C++ -*-===//
#ifndef MHCC_COMPILER_VERSION_H
#define MHCC_COMPILER_VERSION_H

#include "llvm/ADT/StringRef.h"

namespace mhcc {

/// Makes `--version` print one line: the tool, mhcc's version
/// (runtime::kMhccVersion, shared with mhcrun), the artifact
/// format version it writes and the LLVM/MLIR it is built on, e.g.
/// "mhcc 0.1.0 (artifact format 1, LLVM/MLIR 22.1.8)".
void setVersionPrinter(llvm::StringRef tool);

} // namespace mhcc

#endif // MHCC_COMPILER_VERSION_H

//===- Version.h - the version line of mhcc's tools ---------------*- C++ -*-===//
#ifndef MHCC_COMPILER_VERSION_H
#define MHCC_COMPILER_VERSION_H

#include "llvm/ADT/StringRef.h"

namespace mhcc {

/// mhcc's own version: raise it with every change users must know about (a
/// new artifact format, changed flags).
inline constexpr const char kMhccVersion[] = "0.1.0";

/// Makes `--version` print one line: the tool, mhcc's version, the artifact
/// format version it writes and the LLVM/MLIR it is built on, e.g.
/// "mhcc 0.1.0 (artifact format 1, LLVM/MLIR 22.1.8)".
void setVersionPrinter(llvm::StringRef tool);

} // namespace mhcc

#endif // MHCC_COMPILER_VERSION_H

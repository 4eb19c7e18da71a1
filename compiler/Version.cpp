//===- Version.cpp - the version line of mhcc's tools -----------------------===//
#include "compiler/Version.h"

#include "runtime/artifact/Artifact.h"
#include "llvm/Config/llvm-config.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/raw_ostream.h"

namespace mhcc {

void setVersionPrinter(llvm::StringRef tool) {
  llvm::cl::SetVersionPrinter([name = tool.str()](llvm::raw_ostream &os) {
    os << name << " " << runtime::kMhccVersion << " (artifact formats " << runtime::kOldestArtifactVersion
       << " to " << runtime::kArtifactVersion << ", LLVM/MLIR " << LLVM_VERSION_STRING << ")\n";
  });
}

} // namespace mhcc

//===- MhcOpt.cpp - mhc-opt ---------------------------------------------------===//
#include "compiler/InitAll.h"
#include "compiler/Version.h"
#include "mlir/Tools/mlir-opt/MlirOptMain.h"

int mhcc::runMhcOpt(int argc, char **argv) {
  mlir::DialectRegistry registry;
  registerAllDialects(registry);
  registerAllPasses();
  setVersionPrinter("mhc-opt");
  return mlir::asMainReturnCode(
      mlir::MlirOptMain(argc, argv, "mhc-opt: mhcc's dialects and passes\n", registry));
}

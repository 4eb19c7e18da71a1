//===- Mhcrun.h - the mhcrun command line --------------------------*- C++ -*-===//
#ifndef MHCC_RUNTIME_CLI_MHCRUN_H
#define MHCC_RUNTIME_CLI_MHCRUN_H

namespace mhcc::runtime {
int runMhcrun(int argc, char **argv);
} // namespace mhcc::runtime

#endif // MHCC_RUNTIME_CLI_MHCRUN_H

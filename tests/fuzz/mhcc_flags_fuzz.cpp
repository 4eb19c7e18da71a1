// libFuzzer target: mhcc's command line (compiler/Driver.h). The input is the
// argument list after the model path, one argument per line. Every list is
// parsed by LLVM's command-line parser into mhcc's flags, checked by
// checkFlags, and, when accepted, drives the compile of the tiny model and
// its summary (schedule simulation, timeline). Any outcome but a crash is
// fine; nothing is written (output and trace paths are only checked).
//
// Only mhcc's own flags are passed on: LLVM's and MLIR's generic ones may
// print and exit (--help, --version), write files (response files, IR
// dumps) or run forever by design (--debug-counter), none of which mhcc owns.
#include "compiler/AutoSchedule.h"
#include "compiler/Driver.h"
#include "compiler/InitAll.h"

#include "mlir/IR/AsmState.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Support/Timing.h"

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <set>
#include <string>
#include <fcntl.h>
#include <unistd.h>
#include <vector>

using namespace mlir;

namespace {

// models/tiny.json: four layers and an MTP module.
constexpr const char kTinyModel[] = R"json({"format":"mhcc-model-v1","name":"tiny","description":"Byte-level toy model for CPU tests and the quickstart.","config":{"vocab":256,"hidden":64,"heads":4,"ffn_hidden":176,"seq_len":128,"streams":4},"nodes":[{"name":"embed","op":"embedding"},{"name":"expand","op":"mhc_expand","inputs":["embed"]},{"name":"layer0.attn","op":"mhc_sublayer","inputs":["expand"],"attrs":{"sublayer":"attention"}},{"name":"layer0.mlp","op":"mhc_sublayer","inputs":["layer0.attn"],"attrs":{"sublayer":"mlp"}},{"name":"layer1.attn","op":"mhc_sublayer","inputs":["layer0.mlp"],"attrs":{"sublayer":"attention"}},{"name":"layer1.mlp","op":"mhc_sublayer","inputs":["layer1.attn"],"attrs":{"sublayer":"mlp"}},{"name":"layer2.attn","op":"mhc_sublayer","inputs":["layer1.mlp"],"attrs":{"sublayer":"attention"}},{"name":"layer2.mlp","op":"mhc_sublayer","inputs":["layer2.attn"],"attrs":{"sublayer":"mlp"}},{"name":"layer3.attn","op":"mhc_sublayer","inputs":["layer2.mlp"],"attrs":{"sublayer":"attention"}},{"name":"layer3.mlp","op":"mhc_sublayer","inputs":["layer3.attn"],"attrs":{"sublayer":"mlp"}},{"name":"contract","op":"mhc_contract","inputs":["layer3.mlp"]},{"name":"final_norm","op":"rmsnorm","inputs":["contract"]},{"name":"lm_head","op":"lm_head","inputs":["final_norm"]},{"name":"loss","op":"cross_entropy","inputs":["lm_head"]},{"name":"mtp1","op":"mtp","inputs":["layer3.mlp"],"attrs":{"depth":1}}]})json";

/// The biggest schedule (stages x microbatches) compiled per input: the
/// fuzzer soon finds the largest valid ones, and at thousands of pairs (tens
/// of ms each) a million inputs would take hours. Larger schedules are the
/// compile benchmark's (tools/compile_bench.sh) and the lit tests' work.
constexpr int64_t kMaxFuzzedStageMicrobatches = 256;

struct Harness {
  mhcc::DriverOptions options;
  mhcc::PipelineOptions pipeline;
  mhcc::PipelineFlags pipelineFlags{pipeline};
  std::set<std::string> ownFlags;
  std::string modelPath;

  Harness() {
    // As runMhcc: compileModel applies the pass manager's flags, which must exist.
    registerAsmPrinterCLOptions();
    registerMLIRContextCLOptions();
    registerPassManagerCLOptions();
    registerDefaultTimingManagerCLOptions();
    for (auto &entry : llvm::cl::getRegisteredOptions())
      for (llvm::cl::OptionCategory *category : entry.second->Categories)
        if (category == &mhcc::compilationCategory() || category == &mhcc::pipelineCategory() ||
            category == &mhcc::cudaCategory())
          ownFlags.insert(entry.second->ArgStr.str());
    const char *tmp = getenv("TMPDIR");
    modelPath = std::string(tmp && *tmp ? tmp : "/tmp") + "/mhcc_flags_fuzz_" + std::to_string(getpid()) + ".json";
    std::ofstream(modelPath) << kTinyModel;
  }
  ~Harness() { std::remove(modelPath.c_str()); }

  /// "--pp=2" -> "pp"; arguments not starting with '-' are values.
  bool isOwnFlag(const std::string &arg) const {
    size_t start = arg.find_first_not_of('-');
    if (start == std::string::npos)
      return arg == "-" || arg == "--"; // stdout, end of options
    std::string name = arg.substr(start, arg.find('=') == std::string::npos ? std::string::npos
                                                                              : arg.find('=') - start);
    return ownFlags.count(name) != 0;
  }
};

/// mhcc's refusals are one line on stderr each (LLVM's parser writes there
/// whatever stream it is given): a million of them would bury a fuzzer's
/// report, so stderr is /dev/null while one input runs. A crash report
/// inside is lost, not the crash: libFuzzer keeps the input, and
/// MHCC_FUZZ_VERBOSE=1 replays it with stderr open.
class QuietStderr {
public:
  QuietStderr() {
    static const bool verbose = getenv("MHCC_FUZZ_VERBOSE") != nullptr;
    if (verbose)
      return;
    std::fflush(stderr);
    saved_ = dup(2);
    int null = open("/dev/null", O_WRONLY);
    if (saved_ < 0 || null < 0 || dup2(null, 2) < 0)
      std::abort();
    close(null);
  }
  ~QuietStderr() {
    if (saved_ < 0)
      return;
    llvm::errs().flush();
    dup2(saved_, 2);
    close(saved_);
  }

private:
  int saved_ = -1;
};

Harness &harness() {
  static Harness h;
  return h;
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  Harness &h = harness();
  std::vector<std::string> args = {"mhcc", h.modelPath};
  std::string current;
  for (size_t i = 0; i <= size && args.size() < 64; ++i) {
    if (i == size || data[i] == '\n') {
      if (!current.empty() || i < size)
        args.push_back(current);
      current.clear();
    } else if (data[i] != 0) {
      current += char(data[i]);
    }
  }
  for (size_t i = 2; i < args.size(); ++i)
    if (args[i].empty() || args[i][0] == '@' || (args[i][0] == '-' && !h.isOwnFlag(args[i])))
      return 0;
  std::vector<const char *> argv;
  for (const std::string &a : args)
    argv.push_back(a.c_str());

  QuietStderr quiet;
  llvm::cl::ResetAllOptionOccurrences();
  h.pipeline = mhcc::PipelineOptions();
  std::string parseErrors;
  llvm::raw_string_ostream errs(parseErrors);
  if (!llvm::cl::ParseCommandLineOptions(int(argv.size()), argv.data(), "", &errs))
    return 0;
  if (mhcc::checkFlags(h.options, h.pipeline))
    return 0;
  if (h.options.input != h.modelPath)
    __builtin_trap(); // the positional model path was lost
  const mhcc::PipelineOptions &p = h.pipeline;
  if (p.pp < 1 || p.vpp < 1 || p.microbatches < 1 || p.pp > p.kMaxPipelineRanks ||
      p.vpp > p.kMaxVirtualStages || p.microbatches > p.kMaxMicrobatches)
    __builtin_trap(); // checkFlags accepted values validate() promises to refuse
  const int64_t chunks = p.schedule == "auto" && p.layout.empty() ? mhcc::kAutoMaxVpp : p.vpp;
  if (p.pp * chunks * p.microbatches > kMaxFuzzedStageMicrobatches)
    return 0;

  DialectRegistry registry;
  mhcc::registerAllDialects(registry);
  MLIRContext context(registry, MLIRContext::Threading::DISABLED);
  ScopedDiagnosticHandler noDiagnostics(&context, [](Diagnostic &) { return success(); });
  std::string ranking;
  llvm::raw_string_ostream rankingStream(ranking);
  mhcc::SimulationOptions simulation;
  OwningOpRef<ModuleOp> module =
      mhcc::compileModel(context, h.modelPath, h.pipeline, h.options, simulation, rankingStream);
  if (!module)
    return 0;
  h.options.trace.setValue(""); // checked above; never written here
  std::string summary;
  llvm::raw_string_ostream os(summary);
  (void)mhcc::printSummary(*module, h.options, simulation, os);
  return 0;
}

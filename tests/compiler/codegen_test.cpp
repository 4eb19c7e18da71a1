// CUDA code generation: the emitted source carries the model's constants and
// every kernel the runtime launches; nvcc (where installed, as on CI)
// compiles it into an image that defines each of those kernels and the ABI
// globals the runtime checks; nvcc's failures come back as one error.
#include "compiler/codegen/CudaCodegen.h"
#include "runtime/cuda/ModelKernels.h"

#include <gtest/gtest.h>

#include <cstdlib>

namespace mhcc::codegen {
namespace {

const char *const kLaunched[] = {
#define MHCC_KERNEL_NAME(id, name) name,
    MHCC_MODEL_KERNELS(MHCC_KERNEL_NAME)
#undef MHCC_KERNEL_NAME
};

runtime::ModelInfo model(int64_t streams, int64_t iterations) {
  runtime::ModelInfo m;
  m.name = "codegen-test";
  m.vocab = 256;
  m.hidden = 64;
  m.heads = 4;
  m.ffnHidden = 176;
  m.seqLen = 128;
  m.streams = streams;
  m.sinkhornIterations = iterations;
  return m;
}

TEST(CudaCodegen, SourceCarriesTheModelConstantsAndEveryLaunchedKernel) {
  std::string source = emitModelKernels(model(6, 13), "0x1234");
  EXPECT_NE(source.find("constexpr int kStreams = 6;"), std::string::npos);
  EXPECT_NE(source.find("constexpr int kSinkhornIterations = 13;"), std::string::npos);
  EXPECT_NE(source.find("model 'codegen-test' (model 0x1234)"), std::string::npos);
  // Each launched name is defined by an extern "C" __global__ (launch bounds may sit between).
  for (const char *name : kLaunched) {
    const size_t at = source.find(std::string(" ") + name + "(");
    ASSERT_NE(at, std::string::npos) << name;
    const size_t declaration = source.rfind("extern \"C\" __global__ void ", at);
    ASSERT_NE(declaration, std::string::npos) << name;
    EXPECT_GT(source.find_first_of(";{}", declaration), at) << name << " is not the kernel's own declaration";
  }
  // The image's ABI version is the launch table's (mhcrun refuses any other
  // image: a library change that bumps one and not the other breaks every
  // GPU run, which no CPU test would see otherwise), and so are the tile
  // sizes the host computes grids from and the stream count up to which it
  // launches pass C (beyond, the kernel's body compiles away).
  for (const std::string &global :
       {"mhcc_abi_version = " + std::to_string(runtime::cuda::kModelKernelsAbi) + ";",
        "kMixColumns = " + std::to_string(runtime::cuda::kMixColumns) + ";",
        "kMixTokens = " + std::to_string(runtime::cuda::kMixTokens) + ";",
        "kMixThreads = " + std::to_string(runtime::cuda::kMixThreads) + ";",
        "kMixMaxStreams = " + std::to_string(runtime::cuda::kMixMaxStreams) + ";",
        "kInputGradColumns = " + std::to_string(runtime::cuda::kInputGradColumns) + ";",
        "kClusterBlocks = " + std::to_string(runtime::cuda::kClusterBlocks) + ";",
        "kClusterPad = " + std::to_string(runtime::cuda::kClusterTilePad) + ";"})
    EXPECT_NE(source.find(global), std::string::npos) << global;
  // Different models, different kernels.
  EXPECT_NE(emitModelKernels(model(4, 20), "0x1234"), source);
}

// The storage types come first: an fp32 model stores both activations and
// the residual stream as float, a bf16 model both as bf16 unless its
// residual_dtype asks for an fp32 stream (res_t, ModelKernels.cu).
TEST(CudaCodegen, SourceDeclaresTheActivationAndResidualStorage) {
  runtime::ModelInfo m = model(4, 20);
  auto declares = [](const std::string &source, const char *act, const char *res) {
    return source.find(std::string("using act_t = ") + act + ";\nusing res_t = " + res + ";\n") != std::string::npos;
  };
  EXPECT_TRUE(declares(emitModelKernels(m, "0x1"), "float", "float"));
  m.dtype = "bf16";
  EXPECT_TRUE(declares(emitModelKernels(m, "0x1"), "__nv_bfloat16", "__nv_bfloat16"));
  m.residualDtype = "f32";
  EXPECT_TRUE(declares(emitModelKernels(m, "0x1"), "__nv_bfloat16", "float"));
}

// The runtime launches every kernel of the library as a programmatic
// dependent launch (ModelKernels::launchRaw): one that touched memory before
// kernelPrologue's wait would read its predecessor's output while it is
// still being written, a race no bitwise test is sure to catch. So every
// extern "C" __global__ body opens with the prologue.
TEST(CudaCodegen, EveryKernelOpensWithTheDependentLaunchPrologue) {
  const std::string source = emitModelKernels(model(4, 20), "0x1234");
  const std::string marker = "extern \"C\" __global__";
  int kernels = 0;
  for (size_t at = source.find(marker); at != std::string::npos; at = source.find(marker, at + 1)) {
    // The parameter list's closing parenthesis (launch bounds may come before
    // the name), then the body's brace.
    size_t open = source.find('(', source.find(" mhcc_", at));
    int depth = 0;
    size_t close = open;
    for (; close < source.size(); ++close) {
      depth += source[close] == '(' ? 1 : source[close] == ')' ? -1 : 0;
      if (depth == 0)
        break;
    }
    const size_t brace = source.find('{', close);
    const size_t name = source.find(" mhcc_", at);
    const std::string kernel = source.substr(name + 1, open - name - 1);
    ASSERT_NE(brace, std::string::npos) << kernel;
    const size_t first = source.find_first_not_of(" \n", brace + 1);
    // A kernel taking `early` (MHCC_EARLY_LOADS=1: reads of what was written
    // two or more kernels back before its wait) opens with the prologue
    // unless early; where it waits then, its own comment says.
    if (source.rfind("int early)", close) == close - 9) {
      const std::string opening = "if (!early)\n    kernelPrologue();";
      EXPECT_EQ(source.compare(first, opening.size(), opening), 0) << kernel << " does not open with " << opening;
    } else {
      EXPECT_EQ(source.compare(first, 17, "kernelPrologue();"), 0) << kernel << " does not open with kernelPrologue()";
    }
    ++kernels;
  }
  EXPECT_EQ(kernels, int(std::size(kLaunched))) << "a kernel the launch table does not name, or the reverse";
}

class WithNvcc : public ::testing::Test {
protected:
  void SetUp() override {
    std::string error;
    std::optional<std::string> found = findNvcc("", error);
    if (!found)
      GTEST_SKIP() << error;
    nvcc = *found;
  }
  std::string nvcc;
};

TEST_F(WithNvcc, CompilesAnImageWithEveryKernelAndTheAbiGlobals) {
  runtime::ModelInfo m = model(4, 20);
  std::string error;
  std::optional<runtime::DeviceCode> code = compileModelKernels(m, emitModelKernels(m, "0x1"), nvcc, kCudaArch, error);
  ASSERT_TRUE(code) << error;
  EXPECT_EQ(code->arch, "sm_90");
  EXPECT_EQ(code->streams, 4);
  EXPECT_EQ(code->sinkhornIterations, 20);
  EXPECT_NE(code->compiler.find("nvcc release "), std::string::npos) << code->compiler;
  ASSERT_GT(code->image.size(), 4u);
  EXPECT_EQ(code->image.substr(0, 4), "\x7f" "ELF"); // a cubin
  // The image's symbol table names every kernel the runtime looks up.
  for (const char *name : kLaunched)
    EXPECT_NE(code->image.find(std::string(name) + '\0'), std::string::npos) << name;
  for (const char *global : {"mhcc_abi_version", "mhcc_abi_streams", "mhcc_abi_sinkhorn_iterations",
                             "mhcc_abi_block_threads", "mhcc_abi_chunk_rows", "mhcc_abi_input_grad_columns",
                             "mhcc_abi_input_grad_tokens", "mhcc_abi_fused_tokens", "mhcc_abi_fused_warps",
                             "mhcc_abi_mix_columns", "mhcc_abi_mix_tokens", "mhcc_abi_activation_bytes",
                             "mhcc_abi_residual_bytes", "mhcc_abi_cluster_blocks", "mhcc_abi_cluster_pad"})
    EXPECT_NE(code->image.find(std::string(global) + '\0'), std::string::npos) << global;
}

// Every stream count compiles in both storage types: kernels whose shared
// memory is sized by n (the fused mHC entry, the tensor-core input gradient)
// compile to nothing past the n they support, and the host takes another path.
TEST_F(WithNvcc, CompilesForStreamCountsBeyondTheFusedKernels) {
  for (const char *dtype : {"bf16", "f32"})
    for (int64_t streams : {3, 12}) {
      runtime::ModelInfo m = model(streams, 4);
      m.dtype = dtype;
      std::string error;
      std::optional<runtime::DeviceCode> code =
          compileModelKernels(m, emitModelKernels(m, "0x1"), nvcc, kCudaArch, error);
      EXPECT_TRUE(code) << dtype << ", n = " << streams << ": " << error;
    }
}

// An fp32 residual stream beside bf16 activations: the stream's kernels take
// their quad and element-at-a-time bodies (the 16-byte paths pack one type), at the
// plain residual's n = 1 as at n = 3 (tiny_bf16_fp32_residual's artifacts
// compile n = 4).
TEST_F(WithNvcc, CompilesAnFp32StreamBesideBf16Activations) {
  for (int64_t streams : {1, 3}) {
    runtime::ModelInfo m = model(streams, 4);
    m.dtype = "bf16";
    m.residualDtype = "f32";
    std::string error;
    std::optional<runtime::DeviceCode> code = compileModelKernels(m, emitModelKernels(m, "0x1"), nvcc, kCudaArch, error);
    EXPECT_TRUE(code) << "n = " << streams << ": " << error;
  }
}

TEST_F(WithNvcc, NvccErrorsComeBackAsOneLineWithTheSourceKept) {
  std::string error;
  std::optional<runtime::DeviceCode> code =
      compileModelKernels(model(4, 20), "this is not CUDA;\n", nvcc, "sm_90", error);
  EXPECT_FALSE(code);
  EXPECT_NE(error.find("nvcc failed on the model's kernels for sm_90"), std::string::npos) << error;
  EXPECT_NE(error.find("the source is kept at "), std::string::npos) << error;
  EXPECT_EQ(error.find('\n'), std::string::npos) << error;
}

TEST(CudaCodegen, MissingNvccIsNamed) {
  std::string error;
  EXPECT_FALSE(findNvcc("/nonexistent/nvcc", error));
  EXPECT_NE(error.find("--nvcc /nonexistent/nvcc is not an executable file"), std::string::npos) << error;
}

} // namespace
} // namespace mhcc::codegen

# lit configuration for mhcc. Bazel runs each test file through
# build_defs/lit_runner.sh, which sets the environment variables read here.
import os

import lit.formats

config.name = "mhcc"
config.test_format = lit.formats.ShTest(execute_external=True)
config.suffixes = [".mlir", ".test"]
config.excludes = ["Inputs", "lit.cfg.py"]
config.test_source_root = os.path.dirname(__file__)
config.test_exec_root = os.environ.get("MHCC_LIT_EXEC_ROOT", "/tmp/mhcc-lit")

tools_path = os.environ.get("MHCC_TOOLS_PATH", "")
config.environment["PATH"] = tools_path + os.pathsep + os.environ.get("PATH", "")
source_root = os.environ.get("MHCC_SOURCE_ROOT", os.path.dirname(config.test_source_root))
config.substitutions.append(("%models", os.path.join(source_root, "models")))
config.substitutions.append(("%corpus", os.path.join(source_root, "data", "corpus.txt")))

# Artifacts in lit tests skip the nvcc step unless a test asks for it with
# --cuda-arch (the command line overrides MHCC_OPTIONS); GPU kernels are
# covered by codegen.test, //tests:codegen_test and the artifacts the GPU
# tests use.
config.environment["MHCC_OPTIONS"] = "--cuda-arch=none"

# nvcc as mhcc finds it ($CUDA_HOME/bin, /usr/local/cuda/bin, PATH), for
# tests that read the kernels' PTX ("REQUIRES: nvcc").
import shutil

cuda_home = os.environ.get("CUDA_HOME", "")
for candidate in [os.path.join(cuda_home, "bin", "nvcc") if cuda_home else "", "/usr/local/cuda/bin/nvcc",
                  shutil.which("nvcc") or ""]:
    if candidate and os.access(candidate, os.X_OK):
        config.available_features.add("nvcc")
        config.substitutions.append(("%nvcc", candidate))
        break

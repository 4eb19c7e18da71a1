"""CUDA sources compiled by nvcc (CUDA 13, sm_90) into an ordinary cc_library."""

NVCC = "/usr/local/cuda/bin/nvcc"

NVCC_FLAGS = [
    "-std=c++17",
    "-O3",
    "-Xcompiler=-fPIC",
    "--expt-relaxed-constexpr",
]

# Plain sm_90 machine code; kernels that use wgmma or setmaxnreg name
# SM90A_ARCH instead (nvcc's plain sm_90 pass rejects those instructions).
SM90_ARCH = ["-arch=sm_90"]
SM90A_ARCH = ["-gencode=arch=compute_90a,code=sm_90a"]

def cuda_library(name, srcs, hdrs = [], deps = [], copts = [], arch = SM90_ARCH):
    """Compiles each .cu in srcs with nvcc for `arch`; the objects link like any cc_library."""
    objs = []
    for src in srcs:
        obj = "_objs_cuda/%s/%s.pic.o" % (name, src.replace("/", "_"))
        native.genrule(
            name = "%s_%s_nvcc" % (name, src.replace("/", "_").replace(".", "_")),
            srcs = [src] + hdrs,
            outs = [obj],
            # The system nvcc by absolute path: it finds its headers and
            # libraries relative to its real install directory.
            cmd = "%s %s %s %s -I . -I $(GENDIR) -c $(location %s) -o $@" % (
                NVCC,
                " ".join(NVCC_FLAGS),
                " ".join(arch),
                " ".join(copts),
                src,
            ),
        )
        objs.append(obj)
    native.cc_library(
        name = name,
        srcs = objs,
        hdrs = hdrs,
        deps = deps + ["@cuda//:cudart"],
    )

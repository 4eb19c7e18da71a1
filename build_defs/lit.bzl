"""lit tests under Bazel: one sh_test per test file, run by LLVM 22's lit."""

def lit_test(name, src, data = []):
    native.sh_test(
        name = name,
        srcs = ["//build_defs:lit_runner.sh"],
        args = ["$(location %s)" % src],
        data = [src, "//tests:lit_config", "@llvm//:lit_tools"] + data,
        size = "small",
    )

def glob_lit_tests(srcs, data = []):
    """Creates a lit_test for each file in srcs, named after the file."""
    for src in srcs:
        lit_test(name = src.replace("/", "_").rsplit(".", 1)[0] + "_test", src = src, data = data)

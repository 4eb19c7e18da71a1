"""mlir-tblgen through genrules, the way MLIR's own Bazel overlay (gentbl_cc_library) does."""

def gentbl_cc_library(name, td_file, tbl_outs, td_srcs = [], deps = []):
    """Runs mlir-tblgen once per (flags, output) pair in tbl_outs.

    Produces a cc_library `name` whose textual headers are the generated .inc
    files, so C++ code includes them like any header.

    Args:
      name: the cc_library to create.
      td_file: the main .td file.
      tbl_outs: list of (list of mlir-tblgen flags, output file).
      td_srcs: other .td files td_file includes.
      deps: cc_library deps of the generated code.
    """
    outs = []
    for flags, out in tbl_outs:
        rule_name = "%s_%s_genrule" % (name, out.replace("/", "_").replace(".", "_"))
        native.genrule(
            name = rule_name,
            srcs = depset([td_file] + td_srcs).to_list() + ["@llvm//:td_files"],
            outs = [out],
            tools = ["@llvm//:mlir_tblgen"],
            cmd = ("$(location @llvm//:mlir_tblgen) %s -I external/llvm/include -I . " +
                   "-I $(GENDIR) $(location %s) -o $@") % (" ".join(flags), td_file),
        )
        outs.append(out)
    native.cc_library(
        name = name,
        textual_hdrs = outs,
        deps = deps,
    )

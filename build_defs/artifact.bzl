"""Compiled artifacts as build outputs, for tests and benchmarks."""

def mhcc_artifact(name, model, flags):
    """Runs mhcc on `model` with `flags` and --emit=artifact into NAME.mhcc."""
    native.genrule(
        name = name,
        srcs = [model],
        outs = [name + ".mhcc"],
        tools = ["//compiler:mhcc"],
        cmd = "$(location //compiler:mhcc) $(location %s) %s --emit=artifact -o $@" % (model, flags),
    )

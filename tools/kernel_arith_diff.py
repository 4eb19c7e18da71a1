#!/usr/bin/env python3
"""Whether a change to the kernel library keeps every kernel's arithmetic.

Without a GPU a kernel refactor (a helper extracted, code moved between
files) cannot be run, but it can be compiled: this compiles the generated
kernels of each model with two mhcc binaries (the baseline's and this
tree's) as mhcc does (nvcc, sm_90, -O3) to PTX, and compares, kernel by
kernel, every floating-point value as an expression of the kernel's loads
(opcodes with their rounding, fma against mul + add, the association of
each sum; registers, addresses and the order of independent instructions
ignored), and ptxas's registers and spills. The same expressions are what
"the same bits" rests on here (ptxas's own contraction follows the same
PTX); a GPU run (the goldens) confirms it. Exit status: 0 the same, 1 some kernel's arithmetic differs,
2 bad usage or a failed compile.

  tools/kernel_arith_diff.py --baseline-mhcc OLD/mhcc [--mhcc NEW/mhcc] [MODEL.json ...]
  tools/kernel_arith_diff.py --ptx A.ptx B.ptx
"""
import argparse
import collections
import hashlib
import os
import re
import subprocess
import sys
import tempfile

NVCC_FLAGS = ["-arch=sm_90", "-std=c++17", "-O3", "--expt-relaxed-constexpr"]  # compiler/codegen/CudaCodegen.cpp
DEFAULT_MODELS = ["models/tiny_bf16.json", "models/tiny.json", "models/tiny_bf16_fp32_residual.json",
                  "models/tiny_n1_bf16_fp32_residual.json", "models/1b.json"]
FP_TYPE = re.compile(r"\.(f32|f64|bf16|f16|bf16x2|f16x2)\b")
# Instructions that define no value the arithmetic depends on.
NO_VALUE = ("bra", "ret", "bar", "barrier", "griddepcontrol", "call", "cp.async", "fence", "membar", "exit",
            "trap", "prefetch", "mbarrier", "elect", "setmaxnreg")


def die(message):
    print(message, file=sys.stderr)
    sys.exit(2)


def operands(text):
    """The comma-separated operands of an instruction, braces kept together."""
    out, depth, current = [], 0, ""
    for ch in text:
        if ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(current.strip())
            current = ""
        else:
            current += ch
    if current.strip():
        out.append(current.strip())
    return out


def expand(operand):
    return [r.strip() for r in operand.strip("{}").split(",")] if operand.startswith("{") else [operand]


def kernel_arithmetic(ptx):
    """{kernel: Counter of its floating-point values}: every floating-point
    result and stored value as an expression over leaves, numbered through
    the kernel in text order. Leaves: a load (its kind and constant offset,
    not its base register), a predicate, a constant, a parameter, a special
    register, and a register defined more than once (a loop's accumulator, a
    value merged after a branch); copies and index conversions pass their
    value through. Two kernels computing the same sums from the same loads
    with the same operations (fma or mul + add, rounding, association,
    order) have the same counter, whatever their registers, address
    arithmetic or the order of independent instructions."""
    kernels = {}
    for m in re.finditer(r"\.entry\s+(\w+)\((.*?)\n\}\n", ptx, re.S):
        values, counter = {}, collections.Counter()
        instructions = []
        for line in m.group(2).split(";"):
            line = re.sub(r"//.*", "", line).strip()
            line = re.sub(r"^\$\w+:\s*", "", line)  # labels
            line = re.sub(r"^@!?%\w+\s+", "", line)  # predicates: both arms' values are counted
            if line and not line.startswith((".", "{", "}")):
                op, _, rest = line.partition(" ")
                instructions.append((op, operands(rest)))
        # A register defined more than once (a loop's accumulator, a value
        # merged after a branch) is a leaf: which definition reaches a use
        # depends on the blocks' layout, not on the arithmetic.
        definitions = collections.Counter(
            t for op, args in instructions
            if args and not op.startswith(NO_VALUE + ("st.", "red.")) for t in expand(args[0]))

        def value(operand):
            if operand.startswith("["):
                return "addr"
            if re.fullmatch(r"%\w+", operand) and not re.fullmatch(r"%(tid|ntid|ctaid|nctaid|laneid|clusterid|"
                                                                   r"cluster_ctaid|cluster_nctaid)\w*", operand):
                kind = re.sub(r"\d+$", "", operand)
                return "merged:" + kind if definitions[operand] > 1 else values.get(operand, "undef:" + kind)
            return operand  # constants, special registers, parameter names

        for op, args in instructions:
            if op.startswith(NO_VALUE) or not args:
                continue
            if op.startswith(("st.", "red.")):
                key = hashlib.sha1(repr((op, [value(v) for v in expand(args[-1])])).encode()).hexdigest()
                if FP_TYPE.search(op):
                    counter[key] += 1
                continue
            targets = expand(args[0])
            if op.startswith("mov.") and len(targets) == 1 and len(args) == 2 and not args[1].startswith("{"):
                values[targets[0]] = value(args[1])  # a copy
                continue
            integer = not FP_TYPE.search(op)
            if integer and (op.startswith("setp.") or op.endswith(".pred")):
                for target in targets:  # a predicate: the same choice may be computed another way
                    values[target] = "pred"
                continue
            if re.fullmatch(r"cvt\.[us](32|64)\.[us](32|64)", op):
                values[targets[0]] = value(args[1])  # an index widened or narrowed
                continue
            if op.startswith("ld."):  # a leaf: the kind of load and its constant offset, not its base
                offset = re.search(r"\+\s*(-?\d+)\s*\]", args[-1])
                sources = ["load", offset.group(1) if offset else "0"]
            else:
                sources = [value(v) for a in args[1:] for v in expand(a)]
            key = hashlib.sha1(repr((op, sources)).encode()).hexdigest()
            for i, target in enumerate(targets):
                values[target] = key if len(targets) == 1 else f"{key}.{i}"
            if not integer and not op.startswith(("ld.", "mov.")):
                counter[key] += 1
        kernels[m.group(1)] = counter
    return kernels


def compare(old, new, label):
    """Lines naming each kernel whose arithmetic differs (or that is only on one side)."""
    problems = []
    for name in sorted(set(old) | set(new)):
        if name not in old or name not in new:
            problems.append(f"{label}: {name} only in the {'new' if name in new else 'baseline'} kernels")
        elif old[name] != new[name]:
            gone, added = sum((old[name] - new[name]).values()), sum((new[name] - old[name]).values())
            problems.append(f"{label}: {name}: {gone} of its {sum(old[name].values())} floating-point values "
                            f"differ ({added} new ones)")
    return problems


def run(cmd):
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        die(f"kernel_arith_diff: {' '.join(cmd)} failed: {(result.stderr or result.stdout).strip()[:400]}")
    return result


def compile_model(mhcc, nvcc, model, workdir, tag):
    """PTX text and ptxas's per-kernel resource lines of `model`'s kernels as `mhcc` generates them."""
    base = os.path.join(workdir, f"{tag}_{os.path.basename(model)}")
    run([mhcc, model, "--emit=cuda", "-o", base + ".cu"])
    run([nvcc, "-ptx", *NVCC_FLAGS, "-o", base + ".ptx", base + ".cu"])
    verbose = run([nvcc, "-cubin", *NVCC_FLAGS, "-Xptxas", "-v", "-o", base + ".cubin", base + ".cu"])
    resources, kernel = {}, None
    for line in verbose.stderr.splitlines():
        m = re.search(r"Compiling entry function '(\w+)'", line)
        if m:
            kernel = m.group(1)
        elif kernel and ("registers" in line or "spill" in line):
            resources.setdefault(kernel, []).append(re.sub(r"^ptxas info\s*:\s*", "", line).strip())
    with open(base + ".ptx") as f:
        return f.read(), resources


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline-mhcc", help="mhcc built at the baseline commit")
    parser.add_argument("--mhcc", default="bazel-bin/compiler/mhcc", help="mhcc of this tree")
    parser.add_argument("--nvcc", default=os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin/nvcc"))
    parser.add_argument("--ptx", nargs=2, metavar=("A", "B"), help="compare two PTX files instead")
    parser.add_argument("models", nargs="*")
    args = parser.parse_args()
    if args.ptx:
        texts = []
        for path in args.ptx:
            try:
                with open(path) as f:
                    texts.append(f.read())
            except OSError as e:
                die(f"kernel_arith_diff: {path}: {e.strerror}")
        problems = compare(kernel_arithmetic(texts[0]), kernel_arithmetic(texts[1]), "ptx")
        print("\n".join(problems) or f"{len(kernel_arithmetic(texts[1]))} kernels, the same arithmetic")
        return 1 if problems else 0
    if not args.baseline_mhcc:
        parser.print_usage(sys.stderr)
        die("kernel_arith_diff: give --baseline-mhcc (or --ptx A B)")
    for tool in (args.baseline_mhcc, args.mhcc, args.nvcc):
        if not os.access(tool, os.X_OK):
            die(f"kernel_arith_diff: {tool} is not an executable")
    problems, count = [], 0
    with tempfile.TemporaryDirectory(prefix="kernel_arith_") as workdir:
        for model in args.models or DEFAULT_MODELS:
            old_ptx, old_res = compile_model(args.baseline_mhcc, args.nvcc, model, workdir, "baseline")
            new_ptx, new_res = compile_model(args.mhcc, args.nvcc, model, workdir, "new")
            old, new = kernel_arithmetic(old_ptx), kernel_arithmetic(new_ptx)
            label = os.path.basename(model)
            found = compare(old, new, label)
            problems += found
            count += len(new)
            for kernel in sorted(set(old_res) & set(new_res)):
                if old_res[kernel] != new_res[kernel]:
                    print(f"{label}: {kernel}: resources {'; '.join(old_res[kernel])} -> {'; '.join(new_res[kernel])}")
            print(f"{label}: {len(new)} kernels, {len(found)} with other arithmetic")
    print("\n".join(problems) or f"the same arithmetic in all {count} kernels")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Whether a change to the kernel library keeps every kernel's arithmetic.

Without a GPU a kernel refactor (a helper extracted, code moved between
files) cannot be run, but it can be compiled: this compiles the generated
kernels of each model with two mhcc binaries (the baseline's and this
tree's) as mhcc does (nvcc, sm_90, -O3) to PTX, and compares, kernel by
kernel, every floating-point value and global store as an expression of
the kernel's loads (opcodes with their rounding, fma against mul + add,
the association and order of each sum, guards, the buffers read and
written; registers, index arithmetic and the order of independent
instructions ignored: function_arithmetic), and ptxas's registers and
spills. The same expressions are what "the same bits" rests on here
(ptxas's own contraction follows the same PTX); a GPU run (the goldens)
confirms it. Exit status: 0 the same, 1 some kernel's arithmetic differs,
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
NO_VALUE = ("bra", "ret", "bar", "barrier", "griddepcontrol", "cp.async.commit", "cp.async.wait", "fence", "membar",
            "exit", "trap", "prefetch", "mbarrier", "elect", "setmaxnreg")


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


EXPRESSIONS = {}  # key -> (opcode, sources), for --explain
EXPLAIN = 0


def remember(parts, shown_op, shown_sources):
    """The key of an expression (its parts hashed), kept for --explain."""
    key = hashlib.sha1(repr(parts).encode()).hexdigest()
    EXPRESSIONS[key] = (shown_op, shown_sources)
    return key


def constant_offset(address):
    """The constant offset of an address operand ("[%rd4+512]": "512"), else "0"."""
    m = re.search(r"\+\s*(-?\d+)\s*\]", address)
    return m.group(1) if m else "0"


def explain(key, depth=0):
    """An expression's first levels, for reading a difference."""
    if key not in EXPRESSIONS or depth > 3:
        return key[:8] if re.fullmatch(r"[0-9a-f]{40}(\.\d+)?", key) else key
    op, sources = EXPRESSIONS[key]
    return f"{op}({', '.join(explain(x, depth + 1) if isinstance(x, str) else str(x) for x in sources)})"


SPECIAL = re.compile(r"%(tid|ntid|ctaid|nctaid|laneid|warpid|clusterid|cluster_ctaid|cluster_nctaid|"
                     r"cluster_ctarank|smid|globaltimer|clock)\w*")


def statements(body):
    """(predicate, opcode, operands) of a function body in text order: the
    statements of inline-asm scopes ({ ... }) too, their scope's registers
    (.reg inside braces) renamed apart, so that each block's temporaries
    are values of their own."""
    out, scopes, counter = [], [], 0
    renames = [{}]
    for piece in re.sub(r"//[^\n]*", "", body).split(";"):
        piece = piece.strip()
        while True:
            piece = re.sub(r"^\$\w+:\s*", "", piece).strip()  # labels
            if piece.startswith("{"):
                counter += 1
                scopes.append(counter)
                renames.append(dict(renames[-1]))
                piece = piece[1:].strip()
            elif piece.startswith("}"):
                if scopes:
                    scopes.pop()
                    renames.pop()
                piece = piece[1:].strip()
            else:
                break
        if not piece:
            continue
        if piece.startswith(".reg") and scopes:
            for name in re.split(r"\s*,\s*", re.sub(r"^\.reg\s+\.\w+\s+", "", piece)):
                m = re.fullmatch(r"(%?\w+?)<(\d+)>", name.strip())
                for one in ([f"{m.group(1)}{i}" for i in range(int(m.group(2)))] if m else [name.strip()]):
                    renames[-1][one] = f"%scoped{scopes[-1]}_{one.lstrip('%')}"
            continue
        if piece.startswith("."):
            continue
        predicate = ""
        m = re.match(r"^@(!?)(%?\w+)\s+(.*)$", piece, re.S)
        if m:
            predicate, piece = "@" + m.group(1) + " " + renames[-1].get(m.group(2), m.group(2)), m.group(3)
        op, _, rest = piece.partition(" ")
        args = [re.sub(r"(?<![\w%.])(%?\w+)", lambda t: renames[-1].get(t.group(1), t.group(1)), a)
                for a in operands(rest.strip())]
        out.append((predicate, op.strip(), args))
    return out


def function_arithmetic(body):
    """Counter of a function's floating-point values and its global stores,
    each as an expression over leaves, numbered in text order. Leaves: a
    load (its kind, constant offset and the kernel parameters its address
    derives from, not the index arithmetic), a kernel parameter, a
    predicate, a constant, a special register, and a register defined more
    than once (a loop's accumulator, a value merged after a branch: which
    definition reaches a use, and where the compiler puts its copies at a
    join, depend on the layout, so two accumulators fed alike but stored
    crosswise look the same). A register read before its definition in the
    text takes the value the pass before found; copies and index
    conversions pass their value through; a predicated instruction keeps
    its guard (sense and predicate); the statements of inline-asm blocks
    count (bf16 conversions, ldmatrix and cp.async are such blocks); a
    copy into shared memory (cp.async) counts with its source and target
    buffers, a call with its callee and arguments, and what it returns is
    that call's.
    """
    code = statements(body)
    defined = collections.Counter(t for _, op, args in code
                                  if args and not op.startswith(NO_VALUE + ("st.", "red."))
                                  for t in expand(args[0]))
    earlier = {}
    # Three passes, so that a register read before its definition in the
    # text (a loop's body laid out after its use) takes its value.
    for _ in range(3):
        values, roots, counter = {}, {}, collections.Counter()

        def value(operand):
            operand = operand.strip()
            if operand.startswith("["):
                return "addr"
            if re.fullmatch(r"%\w+", operand) and not SPECIAL.fullmatch(operand):
                kind = re.sub(r"\d+$", "", operand)
                if defined[operand] > 1:
                    return "merged:" + kind
                # Read before its definition in the text (a loop's body
                # laid out after its use): the previous pass's value.
                return values.get(operand, earlier.get(operand, "undef:" + kind))
            return operand  # constants, special registers, symbols

        def rooted(operand):
            """The kernel parameters an address or index derives from."""
            names = set()
            for reg in re.findall(r"%\w+", operand):
                names |= roots.get(reg, set())
            for sym in re.findall(r"(?<![%\w.$])([A-Za-z_]\w*)", operand):
                # a parameter, a shared array, a global; the local stack
                # (__local_depotN: numbered by the function's place in the module)
                names.add(re.sub(r"^(__local_depot)\d+$", r"\1", sym))
            return sorted(names)

        arguments, returned = {}, "no call"  # st.param'd arguments of the next call; the last call's value
        for predicate, op, args in code:
            if op.startswith(NO_VALUE) or not args:
                continue
            guard = ""
            if predicate:  # its sense and the predicate's value
                sense, _, reg = predicate.partition(" ")
                guard = sense + value(reg)
            if op.startswith("st.param"):  # a call's argument
                arguments[args[0]] = [value(v) for a in args[1:] for v in expand(a)]
                continue
            if op.startswith("call"):
                callee = next((a for a in args if not a.startswith("(")), "?")
                returned = remember((guard, op, callee, sorted(arguments.items())), guard + op + " " + callee,
                                    [str(sorted(arguments.items()))])
                counter[returned] += 1
                arguments = {}
                continue
            if op.startswith("cp.async"):  # a copy into shared memory: where from, where to
                counter[remember((guard, op, rooted(args[0]), constant_offset(args[0]), rooted(args[1]),
                                  constant_offset(args[1]), args[2:]), guard + op, [str(rooted(args[1]))])] += 1
                continue
            if op.startswith(("st.", "red.")):  # st / red [address], value; shared and local stores are staging
                if not op.startswith(("st.shared", "st.local")):
                    stored = [value(v) for a in args[1:] for v in expand(a)]
                    counter[remember((guard, op, rooted(args[0]), constant_offset(args[0]), stored),
                                     guard + op + str(rooted(args[0])), stored)] += 1
                continue
            targets = expand(args[0])
            sources_text = args[1:]
            if op.startswith("mov.") and len(targets) == 1 and len(args) == 2 and not args[1].startswith("{") \
                    and not predicate:
                values[targets[0]] = value(args[1])  # a copy
                roots[targets[0]] = set(rooted(args[1]))
                continue
            integer = not FP_TYPE.search(op)
            if integer and (op.startswith("setp.") or op.endswith(".pred")):
                for target in targets:  # a predicate: the same choice may be computed another way
                    values[target] = "pred"
                continue
            if re.fullmatch(r"cvt\.[us](32|64)\.[us](32|64)", op) and not predicate:
                values[targets[0]] = value(args[1])  # an index widened or narrowed
                roots[targets[0]] = set(rooted(args[1]))
                continue
            loads = op.startswith(("ld.", "ldmatrix"))
            if loads and re.search(r"\[\s*retval", args[-1]):
                sources = ["returned", constant_offset(args[-1]), returned]  # what the last call gave back
            elif loads:  # a leaf: kind, constant offset, the parameters its address derives from
                sources = ["load", constant_offset(args[-1]), rooted(args[-1])]
            else:
                sources = [value(v) for a in sources_text for v in expand(a)]
            key = remember((guard, op, sources), guard + op, sources)
            names = set(rooted(" ".join(sources_text))) if not op.startswith("ld.param") else set(rooted(args[-1]))
            for i, target in enumerate(targets):
                values[target] = key if len(targets) == 1 else f"{key}.{i}"
                roots[target] = names
            if not integer and not loads and not op.startswith("mov."):
                counter[key] += 1
        earlier = values
    return counter


def kernel_arithmetic(ptx):
    """{function: Counter of its values} (function_arithmetic) of every
    kernel (.entry) and device function (.func) a PTX module defines (a
    declaration without a body is not one). Two functions computing the
    same sums from the same loads with the same operations (fma or mul +
    add, rounding, association, order) have the same counter, whatever
    their registers, index arithmetic or the order of independent
    instructions."""
    functions = {}
    for m in re.finditer(r"^[^\S\n]*(?:\.visible\s+|\.weak\s+|\.extern\s+)*\.(?:entry|func)\s+"
                         r"(?:\([^)]*\)\s*)?(\w+)\s*\(", ptx, re.M):
        at = ptx.find(")", m.end())  # the end of its parameter list
        rest = ptx[at + 1:].lstrip() if at >= 0 else ""
        while rest.startswith("."):  # .maxntid, .reqntid and the like before the body
            rest = rest[rest.find("\n") + 1:].lstrip()
        if not rest.startswith("{"):
            continue  # a declaration
        end = rest.find("\n}\n")
        functions[m.group(1)] = function_arithmetic(rest[1:end if end >= 0 else len(rest)])
    return functions


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
            if EXPLAIN:
                problems += [f"  baseline: {explain(k)[:600]}" for k in list(old[name] - new[name])[:EXPLAIN]]
                problems += [f"  new:      {explain(k)[:600]}" for k in list(new[name] - old[name])[:EXPLAIN]]
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
    # ptxas on that PTX, as nvcc -cubin runs it, rather than the front end a second time.
    verbose = run([os.path.join(os.path.dirname(nvcc), "ptxas"), "-arch=sm_90", "-O3", "-v", "-o", base + ".cubin",
                   base + ".ptx"])
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
    parser.add_argument("--explain", type=int, default=0, metavar="N",
                        help="print N differing expressions of each side per kernel (their first levels)")
    parser.add_argument("models", nargs="*")
    args = parser.parse_args()
    global EXPLAIN
    EXPLAIN = args.explain
    if args.ptx:
        texts = []
        for path in args.ptx:
            try:
                with open(path) as f:
                    texts.append(f.read())
            except OSError as e:
                die(f"kernel_arith_diff: {path}: {e.strerror}")
        old, new = kernel_arithmetic(texts[0]), kernel_arithmetic(texts[1])
        problems = compare(old, new, "ptx")
        print("\n".join(problems) or f"{len(new)} kernels, the same arithmetic")
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

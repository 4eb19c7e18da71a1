#!/usr/bin/env python3
"""Replays an mhcrun CPU training run (`mhcrun --dump-tensors DIR`) with the
float64 NumPy reference and compares: the step's lm and mtp losses, every
parameter's reduced gradient (before clipping), the gradient norm and the
weights after each AdamW step. Also checks the mHC paper's properties on
every sublayer the reference runs: H_res doubly stochastic (within
--sinkhorn-tol), H_pre in (0, 1), H_post in (0, 2).

Usage: check_against_mhcc.py MODEL.json DUMP_DIR [--steps N]
Exit status 0 when every check holds, 1 otherwise (each failure is printed).
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import autograd as ag  # noqa: E402
import mhc_reference as ref  # noqa: E402
import safetensors_np  # noqa: E402


def rel_max(a, b):
    """max|a - b| / max|b| (max-norm relative difference); b is the reference."""
    scale = float(np.max(np.abs(b)))
    diff = float(np.max(np.abs(a.astype(np.float64) - b)))
    return diff / scale if scale > 0 else (0.0 if diff == 0 else np.inf)


def rel(a, b):
    return abs(a - b) / abs(b)


def load_init(model, dump):
    tensors, meta = safetensors_np.load(os.path.join(dump, "init.safetensors"))
    shapes = model.param_shapes()
    dumped = {k[len("weight."):] for k in tensors if k.startswith("weight.")}
    if dumped != set(shapes):
        raise SystemExit(f"parameters differ: only in mhcc {sorted(dumped - set(shapes))}, "
                         f"only in the reference {sorted(set(shapes) - dumped)}")
    weights = {}
    for name, shape in shapes.items():
        w = tensors["weight." + name]
        # mhcc stores vectors as [1, X]; matrices must match exactly.
        if (len(shape) == 2 and w.shape != shape) or w.size != int(np.prod(shape)):
            raise SystemExit(f"{name}: mhcc's shape {w.shape}, the reference's {shape}")
        weights[name] = w.reshape(shape).astype(np.float64)
    return weights, tensors, meta


def check_init(model, weights):
    """The initial values mhc.md and model_format.md specify: alpha = the
    gating factor, b = 0, norm gains = 1, W_map Xavier-uniform; Gated
    DeltaNet's a_log = 0 and dt_bias = log(expm1(0.01)) (softplus = 0.01)."""
    bad = []
    for name, w in weights.items():
        kind = name.rsplit(".", 1)[-1]
        expect = {"alpha": np.float32(model.gating), "b": 0.0, "a_log": 0.0,
                  "dt_bias": np.float32(np.log(np.expm1(0.01)))}.get(kind)
        if kind in ("norm", "norm_hidden", "norm_embedding", "final_norm", "out_norm") or name.endswith("norm.weight"):
            expect = 1.0
        if expect is not None and not np.all(w == expect):
            bad.append(f"initial {name} is not {expect}")
        if kind == "w_map":
            bound = np.sqrt(6.0 / (w.shape[0] + w.shape[1]))
            # Range and mean: the mean of N uniform draws has std bound / sqrt(3 N).
            if not (np.abs(w).max() <= bound * (1 + 1e-6) and np.abs(w).max() >= 0.99 * bound
                    and abs(w.mean()) < 5 * bound / np.sqrt(3 * w.size)):
                bad.append(f"initial {name} is not Xavier-uniform in +-{bound:.4f}")
    return bad


def batches_of(model, tensors, step, microbatches):
    out = []
    for mb in range(microbatches):
        tokens = tensors[f"tokens.step{step}.mb{mb}"].reshape(-1).astype(np.int64)
        labels = tensors[f"labels.step{step}.mb{mb}"].reshape(-1).astype(np.int64)
        # Labels are the next tokens: where both lie in one sequence they must agree.
        inner = (np.arange(model.T) % model.S) < model.S - 1
        if not np.array_equal(labels[:-1][inner[:-1]], tokens[1:][inner[:-1]]):
            raise SystemExit(f"step {step} mb {mb}: labels are not the next tokens")
        if tokens.min() < 0 or max(tokens.max(), labels.max()) >= model.V:
            raise SystemExit(f"step {step} mb {mb}: a token id outside the vocabulary")
        docs = []
        for kind in ("positions", "first_keys"):  # packed documents, when the run had them
            key = f"{kind}.step{step}.mb{mb}"
            docs.append(tensors[key].reshape(-1).astype(np.int64) if key in tensors else None)
        if docs[0] is not None and not (0 <= docs[0].min() and np.all(docs[0] <= np.arange(model.T) % model.S)):
            raise SystemExit(f"step {step} mb {mb}: a position outside its sequence")
        out.append((tokens, labels, tuple(docs)))
    return out


def check_properties(probe, tol):
    """Worst deviations over every recorded sublayer coefficient set."""
    worst = {"H_res row": 0.0, "H_res col": 0.0}
    bad = []
    lo_pre, hi_pre, lo_post, hi_post = np.inf, -np.inf, np.inf, -np.inf
    for name, h_pre, h_post, h_res in probe:
        worst["H_res row"] = max(worst["H_res row"], float(np.max(np.abs(h_res.sum(-1) - 1))))
        worst["H_res col"] = max(worst["H_res col"], float(np.max(np.abs(h_res.sum(-2) - 1))))
        lo_pre, hi_pre = min(lo_pre, h_pre.min()), max(hi_pre, h_pre.max())
        lo_post, hi_post = min(lo_post, h_post.min()), max(hi_post, h_post.max())
        if h_res.min() < 0:
            bad.append(f"{name}: a negative H_res entry")
    print(f"  paper properties over {len(probe)} sublayer evaluations: max |H_res row sum - 1| = "
          f"{worst['H_res row']:.3e}, max |col sum - 1| = {worst['H_res col']:.3e} (tolerance {tol:g}); "
          f"H_pre in [{lo_pre:.6f}, {hi_pre:.6f}], H_post in [{lo_post:.6f}, {hi_post:.6f}]")
    for key, value in worst.items():
        if not value <= tol:
            bad.append(f"{key} sums off by {value:.3e} > {tol:g}")
    if not (0 < lo_pre and hi_pre < 1):
        bad.append(f"H_pre leaves (0, 1): [{lo_pre}, {hi_pre}]")
    if not (0 < lo_post and hi_post < 2):
        bad.append(f"H_post leaves (0, 2): [{lo_post}, {hi_post}]")
    return bad


def fp32_floor(model, weights, batches, grads):
    """Per parameter kind (w_map, b, alpha, norm, w_qkv, ...: the name's last
    part), the largest distance between the same reference computed in
    float32 and in float64: the round-off floor of any fp32 implementation.
    One float32 run samples round-off once, so the floor is taken over every
    parameter of a kind. It exceeds 1e-5 for the mHC biases and gating
    factors, whose gradients are small remainders of cancelling terms (near a
    uniform H_res, the Sinkhorn Jacobian almost projects out its input
    gradient)."""
    saved = ag.DTYPE
    ag.DTYPE = np.dtype(np.float32)
    try:
        g32, _, _ = ref.train_step(model, weights, batches, [])
    finally:
        ag.DTYPE = saved
    kind = lambda name: name.rsplit(".", 1)[-1]
    worst = {}
    for k, g in grads.items():
        worst[kind(k)] = max(worst.get(kind(k), 0.0), rel_max(g32[k], g))
    return {k: worst[kind(k)] for k in grads}


def compare_losses_and_grads(step, got, grads, floor, lm, mtp, args):
    """One step's losses, gradients and gradient norm against mhcc's. A
    gradient passes within max(grad_tol, floor_factor * its fp32 floor)."""
    loss_tol, grad_tol = args.loss_tol, args.grad_tol
    bad = []
    lm_rel = rel(float(got["lm_loss"]), lm)
    line = f"  step {step}: lm loss {lm:.10f} rel {lm_rel:.2e}"
    if not lm_rel <= loss_tol:
        bad.append(f"step {step} lm loss: mhcc {float(got['lm_loss'])!r}, reference {lm!r}, rel {lm_rel:.2e}")
    if mtp is not None:
        mtp_rel = rel(float(got["mtp_loss"]), mtp)
        line += f" | mtp loss {mtp:.10f} rel {mtp_rel:.2e}"
        if not mtp_rel <= loss_tol:
            bad.append(f"step {step} mtp loss: mhcc {float(got['mtp_loss'])!r}, reference {mtp!r}, rel {mtp_rel:.2e}")
    grad_rel = {k: rel_max(got["grad." + k].reshape(g.shape), g) for k, g in grads.items()}
    worst = max(grad_rel, key=grad_rel.get)
    allowed = {k: max(grad_tol, args.floor_factor * floor[k]) for k in grads}
    bad += [f"step {step} gradient of {k}: rel {r:.2e} > {allowed[k]:.2e} (fp32 floor {floor[k]:.2e})"
            for k, r in grad_rel.items() if not r <= allowed[k]]
    above = sorted((k for k, r in grad_rel.items() if r > grad_tol), key=lambda k: -grad_rel[k])
    detail = "".join(f"\n      {k}: rel {grad_rel[k]:.2e}, fp32 floor {floor[k]:.2e}" for k in above[:8])
    detail += f"\n      ... and {len(above) - 8} more" if len(above) > 8 else ""
    norm = float(np.sqrt(sum(float(np.sum(g * g)) for g in grads.values())))
    norm_rel = rel(float(got["grad_norm"]), norm)
    if not norm_rel <= grad_tol:
        bad.append(f"step {step} grad norm: rel {norm_rel:.2e} > {grad_tol:g}")
    line += f" | max grad rel {grad_rel[worst]:.2e} ({worst}) | grad norm rel {norm_rel:.2e}"
    if above:
        line += (f"\n    above {grad_tol:g} (allowed up to {args.floor_factor:g}x the fp32 floor of the "
                 f"parameter's kind):" + detail)
    return line, bad


def free_running(model, weights, meta, batches, dumps, lr, loss_tol):
    """The reference's own trajectory (its gradients, its AdamW) from the
    initial weights. Losses must stay close; weights are reported only: AdamW
    divides each gradient element by its own magnitude, so an element whose
    gradient is at fp32's round-off level (|g| ~ 1e-10 against max|g| ~ 1e-4)
    moves by up to lr in either direction, in mhcc as in any fp32 trainer."""
    print("free running (the reference's own gradients and AdamW from the initial weights):")
    w = {k: v.copy() for k, v in weights.items()}
    adam = ref.AdamW(model.param_shapes(), lr(1), float(meta["beta1"]), float(meta["beta2"]),
                     float(meta["adam_eps"]), float(meta["weight_decay"]), float(meta["clip_grad"]))
    bad = []
    for step, got in enumerate(dumps, start=1):
        grads, lm, mtp = ref.train_step(model, w, batches[step - 1], [])
        adam.lr = lr(step)
        adam.step(w, grads)
        rels = [("lm", rel(float(got["lm_loss"]), lm))]
        if mtp is not None:
            rels.append(("mtp", rel(float(got["mtp_loss"]), mtp)))
        weight_rel = {k: rel_max(got["weight." + k].reshape(v.shape), v) for k, v in w.items()}
        worst = max(weight_rel, key=weight_rel.get)
        print(f"  step {step}: " + ", ".join(f"{k} loss rel {r:.2e}" for k, r in rels)
              + f" | weights max rel {weight_rel[worst]:.2e} ({worst}; reported, not checked)")
        bad += [f"free-running step {step} {k} loss: rel {r:.2e} > {loss_tol:g}" for k, r in rels if not r <= loss_tol]
    return bad


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("dump")
    ap.add_argument("--steps", type=int, default=None, help="steps to replay (default: all dumped)")
    ap.add_argument("--loss-tol", type=float, default=1e-6, help="step-1 loss relative tolerance")
    ap.add_argument("--grad-tol", type=float, default=1e-5, help="gradient max-norm relative tolerance")
    ap.add_argument("--floor-factor", type=float, default=10.0,
                    help="a gradient may also differ by this multiple of its fp32 round-off floor")
    ap.add_argument("--weight-tol", type=float, default=1e-5, help="weight max-norm relative tolerance")
    ap.add_argument("--free-loss-tol", type=float, default=1e-5,
                    help="loss relative tolerance of the reference's own trajectory")
    ap.add_argument("--sinkhorn-tol", type=float, default=1e-6, help="H_res row/column sum tolerance")
    args = ap.parse_args()

    model = ref.Model(args.model)
    weights, init, meta = load_init(model, args.dump)
    if meta.get("optimizer") != "adamw":
        raise SystemExit(f"the reference implements AdamW; the run used {meta.get('optimizer')}")
    steps = args.steps or int(meta["steps"])
    microbatches = int(meta["microbatches"])
    warmup = int(meta["warmup_steps"])
    adam = ref.AdamW(model.param_shapes(), float(meta["lr"]), float(meta["beta1"]), float(meta["beta2"]),
                     float(meta["adam_eps"]), float(meta["weight_decay"]), float(meta["clip_grad"]))
    print(f"reference: {model.name} (n = {model.n}, K = {model.K}, {len(weights)} parameters), "
          f"{steps} steps of {microbatches} microbatches"
          + (f", MHC_REFERENCE_BREAK={ref.BREAK}" if ref.BREAK else ""))
    failures, probe = check_init(model, weights), []
    dumps = [safetensors_np.load(os.path.join(args.dump, f"step{k}.safetensors"))[0] for k in range(1, steps + 1)]
    batches = [batches_of(model, init, k, microbatches) for k in range(1, steps + 1)]
    lr = lambda step: float(meta["lr"]) * (min(1.0, step / warmup) if warmup > 0 else 1.0)

    # Step by step: the reference's gradients at mhcc's weights before the
    # step, and the reference's AdamW applied to mhcc's gradients, each
    # against mhcc's result. Comparing each step from the same inputs keeps
    # fp32 round-off from compounding (see free_running below).
    print("step by step (each step from mhcc's weights before it):")
    before = {k: v.copy() for k, v in weights.items()}
    for step, got in enumerate(dumps, start=1):
        grads, lm, mtp = ref.train_step(model, before, batches[step - 1], probe)
        floor = fp32_floor(model, before, batches[step - 1], grads)
        line, bad = compare_losses_and_grads(step, got, grads, floor, lm, mtp, args)
        failures += bad
        mhcc_grads = {k: got["grad." + k].reshape(g.shape).astype(np.float64) for k, g in grads.items()}
        adam.lr = lr(step)
        adam.step(before, mhcc_grads)
        weight_rel = {k: rel_max(got["weight." + k].reshape(w.shape), w) for k, w in before.items()}
        worst_w = max(weight_rel, key=weight_rel.get)
        failures += [f"step {step} weights of {k} after AdamW: rel {r:.2e} > {args.weight_tol:g}"
                     for k, r in weight_rel.items() if not r <= args.weight_tol]
        print(line + f" | weights after AdamW: max rel {weight_rel[worst_w]:.2e} ({worst_w})")
        before = {k: got["weight." + k].reshape(w.shape).astype(np.float64) for k, w in before.items()}
    failures += free_running(model, weights, meta, batches, dumps, lr, args.free_loss_tol)
    failures += check_properties(probe, args.sinkhorn_tol)
    for f in failures:
        print("FAIL: " + f)
    print(f"reference: {'FAILED, ' + str(len(failures)) + ' check(s)' if failures else 'every check holds'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

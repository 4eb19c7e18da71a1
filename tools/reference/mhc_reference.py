"""An independent mHC transformer in NumPy float64: forward, backward, AdamW.

Written from the specification (/work/shared/design/mhc.md, docs/model_format.md)
and the model JSON; it shares no code or generated tables with mhcc. The
conventions the specification leaves open, and which were read from mhcc's
C++ (then re-derived here), are listed in docs/reference.md.

A deliberately broken variant, for showing that the comparison can fail, is
chosen with the environment variable MHC_REFERENCE_BREAK:
  rms_per_stream   the mHC coefficient RMS taken per stream (C values)
                   instead of over the flattened n*C vector
  sinkhorn_short   one Sinkhorn-Knopp iteration fewer than the model's K
  no_documents     packed documents ignored: one document per sequence
  gdn_conv_flipped Gated DeltaNet's convolution taps applied in reverse order
"""
import json
import os

import numpy as np

import autograd as ag

MHC_RMS_EPS = 1e-6       # r = 1 / (rms(x) + 1e-6)          (mhc.md)
SINKHORN_CLAMP = 1e-6    # every Sinkhorn divisor >= 1e-6   (mhc.md)
ROPE_BASE = 10000.0      # convention taken from mhcc's CPU kernels
GDN_CONV_WIDTH = 4       # Gated DeltaNet's short convolution (FLA's default)
GDN_L2_EPS = 1e-6        # q, k / sqrt(sum of squares + 1e-6)

BREAK = os.environ.get("MHC_REFERENCE_BREAK", "")
BREAKS = ("rms_per_stream", "sinkhorn_short", "no_documents", "gdn_conv_flipped")
if BREAK not in ("",) + BREAKS:
    raise SystemExit(f"MHC_REFERENCE_BREAK={BREAK}: expected one of {', '.join(BREAKS)}")


class Model:
    """The model graph (mhcc-model-v1) with its configuration defaults."""

    def __init__(self, path):
        with open(path) as f:
            doc = json.load(f)
        if doc.get("format") != "mhcc-model-v1":
            raise ValueError(f"{path}: not an mhcc-model-v1 graph")
        c = doc["config"]
        self.name = doc["name"]
        self.V, self.C, self.heads, self.F = c["vocab"], c["hidden"], c["heads"], c["ffn_hidden"]
        self.S, self.B = c["seq_len"], c.get("micro_batch", 1)
        self.n = c.get("streams", 4)
        self.K = c.get("sinkhorn_iterations", 20)
        self.gating = c.get("gating_factor", 0.01)
        self.eps = c.get("norm_eps", 1e-6)
        self.nodes = _topological(doc["nodes"])
        self.T = self.S * self.B

    def param_shapes(self):
        """{name: natural shape}: vectors 1-D, matrices 2-D (decay goes by this)."""
        shapes = {}
        for node in self.nodes:
            op, name = node["op"], node["name"]
            if op == "embedding":
                shapes[name + ".weight"] = (self.V, self.C)
            elif op == "mhc_sublayer":
                shapes.update(self._sublayer_shapes(name, node["attrs"]["sublayer"]))
            elif op == "rmsnorm":
                shapes[name + ".weight"] = (self.C,)
            elif op == "lm_head":
                shapes[name + ".weight"] = (self.C, self.V)
            elif op == "mtp":
                shapes[name + ".norm_hidden"] = (self.C,)
                shapes[name + ".norm_embedding"] = (self.C,)
                shapes[name + ".proj"] = (2 * self.C, self.C)
                shapes.update(self._sublayer_shapes(name + ".attn", "attention"))
                shapes.update(self._sublayer_shapes(name + ".mlp", "mlp"))
                shapes[name + ".final_norm"] = (self.C,)
        return shapes

    def _sublayer_shapes(self, name, kind):
        n, C, F, H = self.n, self.C, self.F, self.heads
        shapes = {}
        if n > 1:
            width = n * n + 2 * n
            shapes.update({name + ".w_map": (n * C, width), name + ".b": (width,), name + ".alpha": (3,)})
        shapes[name + ".norm"] = (C,)
        if kind == "attention":
            shapes.update({name + ".w_qkv": (C, 3 * C), name + ".w_o": (C, C)})
        elif kind == "gdn":
            shapes.update({name + ".w_qkv": (C, 3 * C), name + ".conv": (GDN_CONV_WIDTH, 3 * C),
                           name + ".w_ab": (C, 2 * H), name + ".a_log": (H,), name + ".dt_bias": (H,),
                           name + ".out_norm": (C // H,), name + ".w_gate": (C, C), name + ".w_o": (C, C)})
        else:
            shapes.update({name + ".w_gate": (C, F), name + ".w_up": (C, F), name + ".w_down": (F, C)})
        return shapes


def _topological(nodes):
    done, order, pending = set(), [], list(nodes)
    while pending:
        ready = [n for n in pending if all(i in done for i in n.get("inputs", []))]
        if not ready:
            raise ValueError("the model graph has a cycle or a dangling input")
        for n in ready:
            order.append(n)
            done.add(n["name"])
            pending.remove(n)
    return order


# ---- the pieces -------------------------------------------------------------------------

def rms_norm(u, gain, eps):
    inv = 1.0 / ag.sqrt(ag.mean(u * u, -1, keepdims=True) + eps)
    return u * inv * gain


def sinkhorn(logits, iterations):
    """logits [..., n, n] -> approximately doubly stochastic, differentiated
    through every unrolled iteration. The row-max shift is a constant: the
    first row normalization cancels it exactly."""
    m = ag.exp(logits - logits.value.max(axis=-1, keepdims=True))
    for _ in range(iterations):
        m = m / ag.clamp_min(ag.sum(m, -1, keepdims=True), SINKHORN_CLAMP)
        m = m / ag.clamp_min(ag.sum(m, -2, keepdims=True), SINKHORN_CLAMP)
    return m


def mhc_coefficients(x, P, name, model):
    """x [T, n*C] -> H_pre [T, n], H_post [T, n], H_res [T, n, n]."""
    n, C, T = model.n, model.C, x.shape[0]
    width = n * n + 2 * n
    # [alpha_pre] * n, [alpha_post] * n, [alpha_res] * n*n as a product with
    # a 0/1 selection matrix, so that alpha's gradient sums its groups.
    select = np.zeros((3, width))
    select[0, :n], select[1, n:2 * n], select[2, 2 * n:] = 1, 1, 1
    alphas = ag.reshape(P[name + ".alpha"], (1, 3)) @ select
    if BREAK == "rms_per_stream":
        xs = ag.reshape(x, (T, n, C))
        r = 1.0 / (ag.sqrt(ag.mean(xs * xs, -1, keepdims=True)) + MHC_RMS_EPS)
        h = (ag.reshape(xs * r, (T, n * C)) @ P[name + ".w_map"]) * alphas + P[name + ".b"]
    else:
        r = 1.0 / (ag.sqrt(ag.mean(x * x, -1, keepdims=True)) + MHC_RMS_EPS)  # [T, 1]
        h = r * (x @ P[name + ".w_map"]) * alphas + P[name + ".b"]
    h_pre = ag.sigmoid(h[:, :n])
    h_post = 2.0 * ag.sigmoid(h[:, n:2 * n])
    iterations = model.K - 1 if BREAK == "sinkhorn_short" else model.K
    h_res = sinkhorn(ag.reshape(h[:, 2 * n:], (T, n, n)), iterations)
    return h_pre, h_post, h_res


def rope_tables(model, positions):
    """cos and sin [B, 1, S, d] of each token's position (positions [B, S]),
    each pair (2j, 2j+1) rotated by pos * base^(-2j/d); and the constant
    d x d matrix that maps a row to its pair-swapped (-b, a) form."""
    d = model.C // model.heads
    j = np.arange(d // 2)
    theta = positions[:, None, :, None] * ROPE_BASE ** (-2.0 * j / d)
    cos, sin = np.repeat(np.cos(theta), 2, axis=-1), np.repeat(np.sin(theta), 2, axis=-1)
    swap = np.zeros((d, d))
    swap[2 * j + 1, 2 * j] = -1.0  # out[2j]   = -in[2j+1]
    swap[2 * j, 2 * j + 1] = 1.0   # out[2j+1] =  in[2j]
    return cos, sin, swap


def attention(x, P, name, model, docs):
    """Causal multi-head self-attention with rotary positions, x [T, C].
    docs: (positions, first_keys), each [T] or None: packed documents' RoPE
    positions (else the offset in the sequence) and the first key each query
    sees (else 0), as mhcrun --dump-tensors writes them."""
    B, S, H, C = model.B, model.S, model.heads, model.C
    d = C // H
    positions, first_keys = (None, None) if BREAK == "no_documents" else docs
    positions = (np.tile(np.arange(S), (B, 1)) if positions is None else positions.reshape(B, S))
    first_keys = np.zeros((B, S), dtype=np.int64) if first_keys is None else first_keys.reshape(B, S)
    qkv = x @ P[name + ".w_qkv"]
    heads = lambda part: ag.transpose(ag.reshape(part, (B, S, H, d)), (0, 2, 1, 3))  # [B, H, S, d]
    q, k, v = heads(qkv[:, :C]), heads(qkv[:, C:2 * C]), heads(qkv[:, 2 * C:])
    cos, sin, swap = rope_tables(model, positions)
    q = q * cos + (q @ swap) * sin
    k = k * cos + (k @ swap) * sin
    scores = (q @ ag.transpose(k, (0, 1, 3, 2))) * (1.0 / np.sqrt(d))
    key = np.arange(S)[None, None, :]
    hidden = (key > np.arange(S)[None, :, None]) | (key < first_keys[:, :, None])  # [B, S query, S key]
    scores = scores + np.where(hidden[:, None], -np.inf, 0.0)
    e = ag.exp(scores - scores.value.max(axis=-1, keepdims=True))
    p = e / ag.sum(e, -1, keepdims=True)
    o = ag.reshape(ag.transpose(p @ v, (0, 2, 1, 3)), (B * S, C))
    return o @ P[name + ".w_o"]


def gated_delta_net(x, P, name, model, docs):
    """Gated DeltaNet (docs/model_format.md), x [T, C], the recurrence written
    as the delta rule reads: S <- alpha S; S <- S + beta (v - S k) k^T;
    o = S q / sqrt(d), all heads of all sequences at once, token by token.
    docs as attention()'s: a document's first token restarts the state and
    the convolution reads nothing before it."""
    B, S, H, C, T = model.B, model.S, model.heads, model.C, model.T
    d = C // H
    first_keys = None if BREAK == "no_documents" else docs[1]
    first = np.zeros(T, dtype=np.int64) if first_keys is None else first_keys.reshape(T)
    offset = np.arange(T) % S
    p = x @ P[name + ".w_qkv"]
    z = None
    for j in range(GDN_CONV_WIDTH):
        back = j if BREAK == "gdn_conv_flipped" else GDN_CONV_WIDTH - 1 - j
        reads = (offset - back >= first).astype(np.float64)[:, None]
        tap = ag.getitem(p, np.maximum(np.arange(T) - back, 0)) * reads * P[name + ".conv"][j]
        z = tap if z is None else z + tap
    a = z * ag.sigmoid(z)
    unit = lambda u: u / ag.sqrt(ag.sum(u * u, -1, keepdims=True) + GDN_L2_EPS)
    per_head = lambda part: ag.reshape(part, (B, S, H, d))
    q, k, v = unit(per_head(a[:, :C])), unit(per_head(a[:, C:2 * C])), per_head(a[:, 2 * C:])
    ab = x @ P[name + ".w_ab"]
    beta = ag.reshape(ag.sigmoid(ab[:, :H]), (B, S, H, 1, 1))
    softplus = lambda y: ag.log(1.0 + ag.exp(y))
    alpha = ag.exp(-1.0 * ag.exp(P[name + ".a_log"]) * softplus(ab[:, H:] + P[name + ".dt_bias"]))
    alpha = ag.reshape(alpha, (B, S, H, 1, 1))
    restart = (offset == first).reshape(B, S)
    state, outs = ag.const(np.zeros((B, H, d, d))), []
    for s in range(S):
        column = lambda u: ag.reshape(u[:, s], (B, H, d, 1))
        kept = (1.0 - restart[:, s]).reshape(B, 1, 1, 1)
        decayed = state * kept * alpha[:, s]
        ks = column(k)
        state = decayed + ((column(v) - decayed @ ks) * beta[:, s]) @ ag.transpose(ks, (0, 1, 3, 2))
        outs.append(ag.reshape(state @ column(q), (B, 1, C)) * (1.0 / np.sqrt(d)))
    o = ag.reshape(ag.concat(outs, 1), (T, H, d))
    g = x @ P[name + ".w_gate"]
    normed = ag.reshape(rms_norm(o, P[name + ".out_norm"], model.eps), (T, C))
    return (normed * g * ag.sigmoid(g)) @ P[name + ".w_o"]


def swiglu(x, P, name):
    a = x @ P[name + ".w_gate"]
    return (a * ag.sigmoid(a) * (x @ P[name + ".w_up"])) @ P[name + ".w_down"]


def sublayer(x, P, name, kind, model, probe, docs):
    """One mHC-wrapped sublayer ("attention", "gdn" or "mlp"), x [T, n*C] -> [T, n*C]."""
    n, C, T = model.n, model.C, x.shape[0]
    mixers = {"attention": attention, "gdn": gated_delta_net}
    inner = lambda u: (mixers[kind](u, P, name, model, docs) if kind in mixers else swiglu(u, P, name))
    if n == 1:
        return x + inner(rms_norm(x, P[name + ".norm"], model.eps))
    h_pre, h_post, h_res = mhc_coefficients(x, P, name, model)
    probe.append((name, h_pre.value, h_post.value, h_res.value))
    xs = ag.reshape(x, (T, n, C))
    u = ag.sum(xs * ag.reshape(h_pre, (T, n, 1)), 1)
    y = inner(rms_norm(u, P[name + ".norm"], model.eps))
    out = h_res @ xs + ag.reshape(h_post, (T, n, 1)) * ag.reshape(y, (T, 1, C))
    return ag.reshape(out, (T, n * C))


def expand(e, model):
    return ag.concat([e] * model.n, 1)  # [T, n*C]: n copies, streams concatenated


def contract(x, model):
    return ag.mean(ag.reshape(x, (x.shape[0], model.n, model.C)), 1)


def cross_entropy(logits, labels, shift, model):
    """Mean over the counted rows of -log softmax(logits)[label]; row t (of
    its sequence) takes the label `shift` rows later and is not counted when
    that falls past the sequence's end."""
    T, S = model.T, model.S
    t = np.arange(T)
    counted = (t % S) + shift < S
    target = np.where(counted, labels[np.minimum(t + shift, T - 1)], 0)
    shifted = logits - logits.value.max(axis=-1, keepdims=True)
    lse = ag.log(ag.sum(ag.exp(shifted), -1))
    nll = lse - ag.pick(shifted, target)
    return ag.sum(nll * counted.astype(np.float64), 0) * (1.0 / counted.sum())


def shifted_tokens(tokens, shift, model):
    """Token `shift` ahead within its sequence (its own token past the end,
    where the loss does not count the row)."""
    t = np.arange(model.T)
    return tokens[np.where((t % model.S) + shift < model.S, t + shift, t)]


def mtp_module(x_final, tokens, labels, P, node, model, head, embed, probe, docs):
    name, depth = node["name"], node.get("attrs", {}).get("depth", 1)
    h = rms_norm(contract(x_final, model), P[name + ".norm_hidden"], model.eps)
    e = rms_norm(ag.rows(P[embed], shifted_tokens(tokens, depth, model)), P[name + ".norm_embedding"], model.eps)
    r = expand(ag.concat([h, e], 1) @ P[name + ".proj"], model)
    r = sublayer(r, P, name + ".attn", "attention", model, probe, docs)
    r = sublayer(r, P, name + ".mlp", "mlp", model, probe, docs)
    f = rms_norm(contract(r, model), P[name + ".final_norm"], model.eps)
    return cross_entropy(f @ P[head], labels, depth, model)


def forward(model, P, tokens, labels, probe, docs=(None, None)):
    """One microbatch: ({loss name: (weight, Var)}); tokens, labels [T];
    docs: packed documents (attention())."""
    values, losses = {}, {}
    embed = next(n["name"] for n in model.nodes if n["op"] == "embedding") + ".weight"
    head = next(n["name"] for n in model.nodes if n["op"] == "lm_head") + ".weight"
    for node in model.nodes:
        op, name, inputs = node["op"], node["name"], [values.get(i) for i in node.get("inputs", [])]
        attrs = node.get("attrs", {})
        if op == "embedding":
            out = ag.rows(P[embed], tokens)
        elif op == "mhc_expand":
            out = expand(inputs[0], model)
        elif op == "mhc_sublayer":
            out = sublayer(inputs[0], P, name, attrs["sublayer"], model, probe, docs)
        elif op == "mhc_contract":
            out = contract(inputs[0], model)
        elif op == "rmsnorm":
            out = rms_norm(inputs[0], P[name + ".weight"], attrs.get("eps", model.eps))
        elif op == "lm_head":
            out = inputs[0] @ P[head]
        elif op == "cross_entropy":
            out = cross_entropy(inputs[0], labels, 0, model)
            losses[attrs.get("loss_name", "lm loss")] = (1.0, out)
        elif op == "mtp":
            out = mtp_module(inputs[0], tokens, labels, P, node, model, head, embed, probe, docs)
            losses.setdefault("mtp loss", [])
            losses["mtp loss"].append((attrs.get("loss_weight", 0.1), out))
        else:
            raise ValueError(f"unknown op {op}")
        values[name] = out
    return losses


def train_step(model, weights, batches, probe):
    """Gradients of the step's objective: the mean over microbatches of lm
    loss + sum of loss_weight * mtp loss. Returns (grads, lm, mtp) with the
    reported losses: means over microbatches (and MTP modules), unweighted."""
    grads = {k: np.zeros_like(v) for k, v in weights.items()}
    lm, mtp = [], []
    for tokens, labels, docs in batches:
        P = {k: ag.param(v) for k, v in weights.items()}
        losses = forward(model, P, tokens, labels, probe, docs)
        total = losses["lm loss"][1]
        lm.append(float(total.value))
        for w, loss in losses.get("mtp loss", []):
            total = total + w * loss
            mtp.append(float(loss.value))
        ag.backward(total * (1.0 / len(batches)))
        for k, p in P.items():
            if p.grad is not None:
                grads[k] += p.grad
    return grads, float(np.mean(lm)), (float(np.mean(mtp)) if mtp else None)


class AdamW:
    """Global-norm clipping, then AdamW with bias correction and decoupled
    weight decay on matrices only (not on gains, biases, gating factors)."""

    def __init__(self, shapes, lr, beta1, beta2, eps, weight_decay, clip):
        self.decay = {k: (weight_decay if len(s) == 2 else 0.0) for k, s in shapes.items()}
        self.lr, self.beta1, self.beta2, self.eps, self.clip = lr, beta1, beta2, eps, clip
        self.m = {k: np.zeros(s) for k, s in shapes.items()}
        self.v = {k: np.zeros(s) for k, s in shapes.items()}
        self.steps = 0

    def step(self, weights, grads):
        """Updates `weights` in place; returns the gradient norm before clipping."""
        self.steps += 1
        norm = float(np.sqrt(sum(float(np.sum(g * g)) for g in grads.values())))
        scale = self.clip / (norm + 1e-6) if self.clip > 0 and norm > self.clip else 1.0
        c1, c2 = 1.0 - self.beta1 ** self.steps, 1.0 - self.beta2 ** self.steps
        for k in weights:
            g = grads[k] * scale
            self.m[k] = self.beta1 * self.m[k] + (1.0 - self.beta1) * g
            self.v[k] = self.beta2 * self.v[k] + (1.0 - self.beta2) * g * g
            update = (self.m[k] / c1) / (np.sqrt(self.v[k] / c2) + self.eps)
            weights[k] = weights[k] - self.lr * (update + self.decay[k] * weights[k])
        return norm

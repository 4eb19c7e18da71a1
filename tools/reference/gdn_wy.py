#!/usr/bin/env python3
"""The chunked WY form of the Gated DeltaNet recurrence, as the GPU runs it.

runtime/cuda/GdnWy.cu computes the recurrence S_t = alpha_t S_{t-1} (I -
beta_t k_t k_t^T) + beta_t v_t k_t^T, o_t = scale S_t q_t (zero state at each
document's first token) in chunks of L tokens: per chunk T = (I + A)^-1 with
A = strictly-lower(diag(beta) (K K^T . Gam)), U~ = T diag(beta) V, W = T
diag(beta gam) K; a chain over the chunks (U = U~ - W S0^T, S1 = gam_last S0 +
U^T diag(rho) K); outputs scale (diag(gam) Q S0^T + (Q K^T . Gam) U); and the
backward in the same pieces (docs/model_format.md). This file is that
decomposition in float64 NumPy -- padding of the last chunk, the chain split
into groups of state rows, dU's output term before the chain adds the
state's, the decay's gradient terms in two parts, T by 16 x 16-style blocks --
checked against the token-by-token recurrence (forward) and its float64
finite differences (backward), at several shapes with documents inside and
across chunks. It specifies the kernels' algebra; it does not run them.

  python3 gdn_wy.py            # checks; exit 0 when every error is below 1e-6
  python3 gdn_wy.py --break X  # a deliberately wrong variant (rho, gam_end,
                               # reset, inverse): must fail (exit 1)
"""
import argparse
import sys

import numpy as np


def token_by_token(q, k, v, alpha, beta, starts, scale):
    """The recurrence itself, one token at a time (runtime/cpu/GdnKernels.h's gdnScan)."""
    S = np.zeros((q.shape[1], q.shape[1]))
    out = np.zeros_like(q)
    for t in range(q.shape[0]):
        if starts[t]:
            S[:] = 0
        S = alpha[t] * S
        S = S + beta[t] * np.outer(v[t] - S @ k[t], k[t])
        out[t] = scale * S @ q[t]
    return out


def block_inverse(A, block):
    """(I + A)^-1 for strictly lower A: diagonal blocks by substitution, then a block diagonal at a time."""
    n = A.shape[0]
    T = np.eye(n)
    for b0 in range(0, n, block):
        for r in range(b0 + 1, b0 + block):
            for i in range(b0, r):
                T[r, i] = -A[r, i:r] @ T[i:r, i]
    blocks = n // block
    for d in range(1, blocks):
        for j in range(blocks - d):
            i = j + d
            rs, cs = slice(i * block, (i + 1) * block), slice(j * block, (j + 1) * block)
            Y = A[rs, j * block:i * block] @ T[j * block:i * block, cs]
            T[rs, cs] = -T[rs, rs] @ Y
    return T


class Chunked:
    def __init__(self, L, rows, broken=None):
        self.L, self.R, self.broken = L, rows, broken

    def gates(self, alpha, beta, starts, n):
        """g, document index, reset, gam, beta, Gam and rho of a chunk of n real tokens, padded to L."""
        L = self.L
        g, seg, reset = np.zeros(L), np.zeros(L, int), np.zeros(L, bool)
        gam, b = np.zeros(L), np.zeros(L)
        acc, s, open_ = 0.0, 0, True
        for r in range(L):
            real = r < n
            if real and starts[r] and self.broken != "reset":
                s, acc, open_ = s + 1, 0.0, False
            elif real:
                acc += max(np.log(alpha[r]), -80.0)
            g[r], seg[r], reset[r] = acc, s, real and starts[r]
            gam[r] = np.exp(acc) if open_ else 0.0
            b[r] = beta[r] if real else 0.0
        same = (seg[:, None] == seg[None, :]) & (np.arange(L)[:, None] >= np.arange(L)[None, :])
        Gam = np.where(same, np.exp(g[:, None] - g[None, :]), 0.0)
        rho = Gam[L - 1].copy() if self.broken != "rho" else np.ones(L)
        return g, seg, reset, gam, b, Gam, rho

    def inverse(self, K, b, Gam):
        """T = (I + A)^-1, A = strictly-lower(diag(beta) (K K^T . Gam))."""
        A = np.tril(b[:, None] * Gam * (K @ K.T), -1)
        return block_inverse(A, self.L // 4) if self.broken != "inverse" else np.eye(self.L) - A

    def pad(self, x, n):
        y = np.zeros((self.L,) + x.shape[1:])
        y[:n] = x[:n]
        return y

    def run(self, q, k, v, alpha, beta, starts, scale, dO):
        L, R = self.L, self.R
        Tn, D = q.shape
        chunks = [(c0, min(L, Tn - c0)) for c0 in range(0, Tn, L)]
        gates = [self.gates(alpha[c0:c0 + n], beta[c0:c0 + n], starts[c0:c0 + n], n) for c0, n in chunks]
        pad = self.pad
        U, W = np.zeros((Tn, D)), np.zeros((Tn, D))
        for (c0, n), (g, seg, reset, gam, b, Gam, rho) in zip(chunks, gates):  # U~, W
            K, V = pad(k[c0:c0 + n], n), pad(v[c0:c0 + n], n)
            T = self.inverse(K, b, Gam)
            U[c0:c0 + n] = (T @ (b[:, None] * V))[:n]
            W[c0:c0 + n] = (T @ ((b * gam)[:, None] * K))[:n]
        S0 = np.zeros((len(chunks), D, D))
        for r0 in range(0, D, R):  # the chain, a group of state rows at a time
            rows, X = slice(r0, r0 + R), np.zeros((R, D))
            for c, ((c0, n), (g, seg, reset, gam, b, Gam, rho)) in enumerate(zip(chunks, gates)):
                S0[c][rows] = X
                Uc = pad(U[c0:c0 + n], n)[:, rows] - pad(W[c0:c0 + n], n) @ X.T
                U[c0:c0 + n, rows] = Uc[:n]
                gam_end = gam[L - 1] if self.broken != "gam_end" else 1.0
                X = gam_end * X + (Uc * rho[:, None]).T @ pad(k[c0:c0 + n], n)
        out = np.zeros((Tn, D))
        dU = np.zeros((Tn, D))
        for c, ((c0, n), (g, seg, reset, gam, b, Gam, rho)) in enumerate(zip(chunks, gates)):
            Q, K, Uo, G = pad(q[c0:c0 + n], n), pad(k[c0:c0 + n], n), pad(U[c0:c0 + n], n), pad(dO[c0:c0 + n], n)
            P = (Q @ K.T) * Gam
            out[c0:c0 + n] = (scale * (gam[:, None] * (Q @ S0[c].T) + P @ Uo))[:n]
            dU[c0:c0 + n] = (scale * P.T @ G)[:n]  # the output's own term of dU
        dS1 = np.zeros((len(chunks), D, D))
        for r0 in range(0, D, R):  # the chain back
            rows, X = slice(r0, r0 + R), np.zeros((R, D))
            for c in reversed(range(len(chunks))):
                (c0, n), (g, seg, reset, gam, b, Gam, rho) = chunks[c], gates[c]
                dS1[c][rows] = X
                Uc = rho[:, None] * (pad(k[c0:c0 + n], n) @ X.T) + pad(dU[c0:c0 + n], n)[:, rows]
                dU[c0:c0 + n, rows] = Uc[:n]
                Oc = pad(dO[c0:c0 + n], n)[:, rows]
                X = gam[L - 1] * X + (scale * Oc * gam[:, None]).T @ pad(q[c0:c0 + n], n) - Uc.T @ pad(W[c0:c0 + n], n)
        dq, dk, dv = np.zeros((Tn, D)), np.zeros((Tn, D)), np.zeros((Tn, D))
        dbeta, dlog_alpha = np.zeros(Tn), np.zeros(Tn)
        for c, ((c0, n), (g, seg, reset, gam, b, Gam, rho)) in enumerate(zip(chunks, gates)):
            Q, K, V = pad(q[c0:c0 + n], n), pad(k[c0:c0 + n], n), pad(v[c0:c0 + n], n)
            Us, G, dUc = pad(U[c0:c0 + n], n), pad(dO[c0:c0 + n], n), pad(dU[c0:c0 + n], n)
            # Through the output and the state (wyGradsKernel).
            QK, dP = Q @ K.T, scale * G @ Us.T
            F = dP * QK * Gam
            dQK = dP * Gam
            X = G @ S0[c]
            dq[c0:c0 + n] = (scale * gam[:, None] * X + dQK @ K)[:n]
            dgam = scale * np.sum(Q * X, 1)
            X = Us @ dS1[c]
            drho = np.sum(X * K, 1)
            dk_c = rho[:, None] * X + dQK.T @ Q
            dW = -dUc @ S0[c]
            terms = F.sum(1) - F.sum(0) + dgam * gam - drho * rho
            terms[L - 1] += np.sum(S0[c] * dS1[c]) * gam[L - 1] + np.sum(drho * rho)
            # Through U~ and W (wyWyGradsKernel).
            T = self.inverse(K, b, Gam)
            KK = K @ K.T
            dT = dUc @ (b[:, None] * V).T + dW @ ((b * gam)[:, None] * K).T
            dA = np.tril(-T.T @ (dT @ T.T), -1)
            X = T.T @ dUc
            db = np.sum(V * X, 1)
            dv[c0:c0 + n] = (b[:, None] * X)[:n]
            X = T.T @ dW
            kd = np.sum(K * X, 1)
            db = db + gam * kd + np.sum(dA * Gam * KK, 1)
            dgam = b * kd
            F = dA * b[:, None] * KK * Gam
            dKK = dA * b[:, None] * Gam
            dk[c0:c0 + n] = (dk_c + (b * gam)[:, None] * X + (dKK + dKK.T) @ K)[:n]
            acc = 0.0
            for r in reversed(range(L)):
                if r == L - 1 or seg[r] != seg[r + 1]:
                    acc = 0.0
                acc += terms[r] + F[r].sum() - F[:, r].sum() + dgam[r] * gam[r]
                if r < n:
                    dlog_alpha[c0 + r] = 0.0 if reset[r] else acc
                    dbeta[c0 + r] = db[r]
        return out, dq, dk, dv, dbeta, dlog_alpha


def check(tokens, D, L, rows, starts_at, broken, rng):
    q = rng.standard_normal((tokens, D))
    k = rng.standard_normal((tokens, D))
    k /= np.linalg.norm(k, axis=1, keepdims=True)
    v = rng.standard_normal((tokens, D))
    alpha = np.exp(-rng.random(tokens) * 0.7)
    beta = 1 / (1 + np.exp(-rng.standard_normal(tokens)))
    starts = np.zeros(tokens, bool)
    starts[list(starts_at)] = True
    scale, dO = 1 / np.sqrt(D), rng.standard_normal((tokens, D))
    out, dq, dk, dv, dbeta, dla = Chunked(L, rows, broken).run(q, k, v, alpha, beta, starts, scale, dO)
    errors = {"out": np.abs(out - token_by_token(q, k, v, alpha, beta, starts, scale)).max()}

    def loss(**x):
        a = dict(q=q, k=k, v=v, alpha=alpha, beta=beta)
        a.update(x)
        return np.sum(token_by_token(a["q"], a["k"], a["v"], a["alpha"], a["beta"], starts, scale) * dO)

    eps = 1e-6
    # (gradient, input it is of, value, d input / d variable: alpha for log alpha)
    for name, arg, x, grad, chain in (("dq", "q", q, dq, 1), ("dk", "k", k, dk, 1), ("dv", "v", v, dv, 1),
                                      ("dbeta", "beta", beta, dbeta, 1), ("dlog_alpha", "alpha", alpha, dla, alpha)):
        num = np.zeros_like(x)
        for idx in np.ndindex(x.shape):
            up, down = x.copy(), x.copy()
            up[idx] += eps
            down[idx] -= eps
            num[idx] = (loss(**{arg: up}) - loss(**{arg: down})) / (2 * eps)
        errors[name] = np.abs(num * chain - grad).max()
    return errors


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--break", dest="broken", choices=["rho", "gam_end", "reset", "inverse"])
    args = parser.parse_args()
    rng = np.random.default_rng(15)
    # (tokens, head dim, chunk, state rows a group, document starts): a partial last chunk, documents starting
    # inside chunks, at a chunk's first token and none but the sequence's.
    cases = [(29, 4, 8, 2, (0, 11, 16, 27)), (24, 8, 8, 4, (0,)), (21, 4, 8, 4, (0, 8, 13))]
    worst = 0.0
    for tokens, D, L, rows, starts in cases:
        errors = check(tokens, D, L, rows, starts, args.broken, rng)
        worst = max(worst, max(errors.values()))
        print("tokens %d, d %d, chunk %d, docs at %s: %s" % (tokens, D, L, list(starts),
                                                             ", ".join("%s %.1e" % kv for kv in errors.items())))
    ok = worst < 1e-6
    print("gdn_wy: %s (largest error %.2e, limit 1e-6)" % ("PASS" if ok else "FAIL", worst))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

//===- MhcOps.td - mhc dialect operations ------------------*- tablegen -*-===//
//
// Layer-level ops. Shapes: T = tokens per microbatch, C = hidden, n = streams,
// V = vocabulary, F = FFN hidden size. The sizes live in one place, the
// #mhc.config of the enclosing function, which verifiers, the cost model and
// the lowering read; ops carry only what differs per node. Every op carries
// `node`, the name of the model-graph node it came from, so diagnostics,
// partitions and parameter layouts can name it.
//
//===----------------------------------------------------------------------===//

#ifndef MHC_OPS_TD
#define MHC_OPS_TD

include "dialects/mhc/IR/MhcBase.td"
include "dialects/mhc/IR/MhcAttrs.td"
include "mlir/IR/CommonAttrConstraints.td"
include "mlir/Interfaces/InferTypeOpInterface.td"
include "mlir/Interfaces/SideEffectInterfaces.td"

def Mhc_Activation : RankedTensorOf<[F32, BF16]>;
def Mhc_TokenIds : 1DTensorOf<[I32]>;
def Mhc_Loss : 0DTensorOf<[F32]>;
def Mhc_PositiveI64 : ConfinedAttr<I64Attr, [IntMinValue<1>]>;

def Mhc_EmbeddingOp : Mhc_Op<"embedding", [Pure]> {
  let summary = "Token embedding lookup: tensor<T x i32> -> tensor<T x C>";
  let arguments = (ins Mhc_TokenIds:$tokens, StrAttr:$node);
  let results = (outs Mhc_Activation:$result);
  let assemblyFormat = "$tokens attr-dict `:` type($tokens) `->` type($result)";
  let hasVerifier = 1;
}

def Mhc_ExpandOp : Mhc_Op<"expand", [Pure]> {
  let summary = "Copies a C-wide hidden state into n residual streams";
  let description = [{
    `x_i = e` for every stream i: tensor<T x C> -> tensor<T x (n*C)>. With
    n = 1 it is the identity.
  }];
  let arguments = (ins Mhc_Activation:$input, StrAttr:$node);
  let results = (outs Mhc_Activation:$result);
  let assemblyFormat = "$input attr-dict `:` type($input) `->` type($result)";
  let hasVerifier = 1;
}

def Mhc_HyperConnectionOp : Mhc_Op<"hyper_connection", [
    SingleBlock, RecursiveMemoryEffects,
    AllTypesMatch<["residual", "result"]>]> {
  let summary = "An mHC-wrapped sublayer (attention, Gated DeltaNet or MLP)";
  let description = [{
    Per token x (n*C values): coefficients
    `h = r * (x @ W_map) * [alpha_pre x n, alpha_post x n, alpha_res x n*n] + b`
    with `r = 1 / (rms(x) + 1e-6)`; `H_pre = sigmoid(h[0:n])`,
    `H_post = 2 sigmoid(h[n:2n])`, `H_res = Sinkhorn(h[2n:])` after
    `sinkhorn_iterations` row/column normalizations (n, the iterations and
    the alphas' initial `gating_factor` come from #mhc.config). The body receives
    `u = sum_i H_pre[i] x_i` (tensor<T x C> of the config's dtype) and yields
    the sublayer output y; the result is `x'_i = sum_j H_res[i][j] x_j +
    H_post[i] y`, of the residual stream's type (residual_dtype).

    With `streams = 1` in the config it is a plain pre-norm residual: `x' = x + body(x)`.
    `layer` is the transformer layer (a pair of a token mixer, attention or
    Gated DeltaNet, and an MLP sublayer) it belongs to; pipeline layouts
    count those layers.
  }];
  let arguments = (ins
    Mhc_Activation:$residual,
    ConfinedAttr<I64Attr, [IntNonNegative]>:$layer,
    StrAttr:$node);
  let results = (outs Mhc_Activation:$result);
  let regions = (region SizedRegion<1>:$body);
  let assemblyFormat = "$residual attr-dict `:` type($residual) $body";
  let hasVerifier = 1;
  let extraClassDeclaration = [{
    /// The sublayer the body computes: "attention", "gdn", "mlp" or "" if none.
    ::llvm::StringRef getSublayerKind();
  }];
}

def Mhc_YieldOp : Mhc_Op<"yield", [
    Pure, Terminator, HasParent<"HyperConnectionOp">]> {
  let summary = "Returns the sublayer output y (tensor<T x C>)";
  let arguments = (ins Mhc_Activation:$value);
  let assemblyFormat = "$value attr-dict `:` type($value)";
}

def Mhc_RmsNormOp : Mhc_Op<"rms_norm", [Pure, SameOperandsAndResultType]> {
  let summary = "RMSNorm over the last axis with a learned gain of size C";
  let arguments = (ins Mhc_Activation:$input, F64Attr:$eps, StrAttr:$node);
  let results = (outs Mhc_Activation:$result);
  let assemblyFormat = "$input attr-dict `:` type($input)";
  let hasVerifier = 1;
}

def Mhc_AttentionOp : Mhc_Op<"attention", [Pure, SameOperandsAndResultType]> {
  let summary = "Causal multi-head self-attention with rotary positions";
  let description = [{
    QKV projection (C -> 3C), rotary position embedding per head, causal
    softmax attention over the sequence, output projection (C -> C).
    Heads and the sequence length come from #mhc.config, whose verifier
    requires an even head dimension C / heads (rotary pairs).
  }];
  let arguments = (ins Mhc_Activation:$input, StrAttr:$node);
  let results = (outs Mhc_Activation:$result);
  let assemblyFormat = "$input attr-dict `:` type($input)";
  let hasVerifier = 1;
}

def Mhc_GatedDeltaNetOp : Mhc_Op<"gated_delta_net", [Pure, SameOperandsAndResultType]> {
  let summary = "Gated DeltaNet token mixer (linear attention with the gated delta rule)";
  let description = [{
    Per head of width d = C / heads (FLA's GatedDeltaNet): q, k, v
    projections (C -> 3C), a 4-tap causal depthwise convolution and silu,
    L2-normalized q and k; gates beta = sigmoid(x W_b) and alpha =
    exp(-exp(A_log) softplus(x W_a + dt_bias)); the state
    S_t = alpha_t S_{t-1} (I - beta_t k_t k_t^T) + beta_t v_t k_t^T, zero at
    each sequence's (and packed document's) start; o_t = S_t q_t / sqrt(d),
    RMSNorm per head gated by silu(x W_gate), output projection (C -> C).
  }];
  let arguments = (ins Mhc_Activation:$input, StrAttr:$node);
  let results = (outs Mhc_Activation:$result);
  let assemblyFormat = "$input attr-dict `:` type($input)";
  let hasVerifier = 1;
}

def Mhc_SwiGluMlpOp : Mhc_Op<"swiglu_mlp", [Pure, SameOperandsAndResultType]> {
  let summary = "SwiGLU MLP: (silu(x W_gate) * (x W_up)) W_down";
  let arguments = (ins Mhc_Activation:$input, StrAttr:$node);
  let results = (outs Mhc_Activation:$result);
  let assemblyFormat = "$input attr-dict `:` type($input)";
  let hasVerifier = 1;
}

def Mhc_ContractOp : Mhc_Op<"contract", [Pure]> {
  let summary = "Mean over the n residual streams: tensor<T x (n*C)> -> tensor<T x C>";
  let arguments = (ins Mhc_Activation:$input, StrAttr:$node);
  let results = (outs Mhc_Activation:$result);
  let assemblyFormat = "$input attr-dict `:` type($input) `->` type($result)";
  let hasVerifier = 1;
}

def Mhc_LmHeadOp : Mhc_Op<"lm_head", [Pure]> {
  let summary = "Output projection to vocabulary logits: tensor<T x C> -> tensor<T x V>";
  let arguments = (ins Mhc_Activation:$input, StrAttr:$node);
  let results = (outs Mhc_Activation:$result);
  let assemblyFormat = "$input attr-dict `:` type($input) `->` type($result)";
  let hasVerifier = 1;
}

def Mhc_CrossEntropyOp : Mhc_Op<"cross_entropy", [Pure]> {
  let summary = "Mean next-token cross-entropy over the microbatch";
  let description = [{
    `loss = -mean_t log softmax(logits[t])[labels[t]]`. `loss_name` is the
    metric the loss is reported as ("lm loss").
  }];
  let arguments = (ins Mhc_Activation:$logits, Mhc_TokenIds:$labels,
                   StrAttr:$loss_name, StrAttr:$node);
  let results = (outs Mhc_Loss:$loss);
  let assemblyFormat = "$logits `,` $labels attr-dict `:` type($logits) `,` type($labels) `->` type($loss)";
  let hasVerifier = 1;
}

def Mhc_MtpOp : Mhc_Op<"mtp", [Pure]> {
  let summary = "Multi-token prediction module (DeepSeek-V3 style) with its own loss";
  let description = [{
    Predicts token t + 1 + depth from the final residual: contracts the
    residual, RMS-normalizes it and the embedding of the token `depth` steps
    ahead, projects their concatenation (2C -> C), runs one mHC transformer
    layer (attention and MLP sublayers), a final RMSNorm and the shared LM
    head, and returns its cross-entropy scaled by `loss_weight` (reported as
    "mtp loss"). It shares the embedding and LM head of the main model.
  }];
  let arguments = (ins
    Mhc_Activation:$residual, Mhc_TokenIds:$tokens, Mhc_TokenIds:$labels,
    Mhc_PositiveI64:$depth, F64Attr:$loss_weight, StrAttr:$node);
  let results = (outs Mhc_Loss:$loss);
  let assemblyFormat = [{
    $residual `,` $tokens `,` $labels attr-dict `:` type($residual) `,`
    type($tokens) `,` type($labels) `->` type($loss)
  }];
  let hasVerifier = 1;
}

#endif // MHC_OPS_TD

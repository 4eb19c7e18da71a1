//===- MhcAttrs.td - mhc dialect attributes ----------------*- tablegen -*-===//

#ifndef MHC_ATTRS_TD
#define MHC_ATTRS_TD

include "dialects/mhc/IR/MhcBase.td"

def Mhc_ModelConfigAttr : Mhc_Attr<"ModelConfig", "config"> {
  let summary = "Global configuration of an mHC model";
  let description = [{
    The model-wide sizes every op is checked against. `streams` is n, the
    number of residual streams (n = 1 is a plain residual model); `hidden` is
    C; tokens per microbatch are `seq_len * micro_batch`. `dtype` is the
    element type of activations and GEMM operands; `residual_dtype`, when
    present, that of the residual stream (expand, each hyper-connection's
    result, the contract's input): f32 in a bf16 model is Megatron's
    fp32-residual-connection (docs/precision.md). Absent, it is `dtype`.

    ```mlir
    #mhc.config<vocab = 256, hidden = 64, heads = 4, ffn_hidden = 176,
                seq_len = 128, micro_batch = 1, streams = 4,
                sinkhorn_iterations = 20, gating_factor = 1.000000e-02 : f64,
                norm_eps = 9.9999999999999995E-7 : f64, dtype = f32, seed = 1234>
    ```
  }];
  let parameters = (ins
    "int64_t":$vocab,
    "int64_t":$hidden,
    "int64_t":$heads,
    "int64_t":$ffn_hidden,
    "int64_t":$seq_len,
    "int64_t":$micro_batch,
    "int64_t":$streams,
    "int64_t":$sinkhorn_iterations,
    "::mlir::FloatAttr":$gating_factor,
    "::mlir::FloatAttr":$norm_eps,
    "::mlir::Type":$dtype,
    OptionalParameter<"::mlir::Type">:$residual_dtype,
    "int64_t":$seed
  );
  let assemblyFormat = "`<` struct(params) `>`";
  let genVerifyDecl = 1;
  let extraClassDeclaration = [{
    /// Tokens in one microbatch: the leading dimension of every activation.
    int64_t getTokens() const { return getSeqLen() * getMicroBatch(); }
    /// Width of the residual stream: n * C.
    int64_t getResidualWidth() const { return getStreams() * getHidden(); }
    /// Element type of the residual stream: residual_dtype, else dtype.
    ::mlir::Type getResidualElementType() const {
      return getResidualDtype() ? getResidualDtype() : getDtype();
    }
  }];
}

#endif // MHC_ATTRS_TD

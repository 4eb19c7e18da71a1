// RUN: mhc-opt %s --split-input-file --verify-diagnostics

// The sizes live in the function's #mhc.config; ops are checked against it.
func.func @no_config(%e: tensor<4x8xf32>) {
  // expected-error @+1 {{must be inside a function carrying #mhc.config ('mhc.config'), which holds the model's sizes}}
  %x = mhc.expand %e {node = "expand"} : tensor<4x8xf32> -> tensor<4x16xf32>
  return
}

// -----

func.func @expand_width(%e: tensor<4x8xf32>) attributes {mhc.config = #mhc.config<vocab = 16, hidden = 8, heads = 2, ffn_hidden = 24,
    seq_len = 4, micro_batch = 1, streams = 2, sinkhorn_iterations = 3,
    gating_factor = 1.0e-02 : f64, norm_eps = 1.0e-06 : f64, dtype = f32, seed = 7>} {
  // expected-error @+1 {{result width 24 must be n*C = 2*8 = 16}}
  %x = mhc.expand %e {node = "expand"} : tensor<4x8xf32> -> tensor<4x24xf32>
  return
}

// -----

func.func @expand_input_width(%e: tensor<4x6xf32>) attributes {mhc.config = #mhc.config<vocab = 16, hidden = 8, heads = 2, ffn_hidden = 24,
    seq_len = 4, micro_batch = 1, streams = 2, sinkhorn_iterations = 3,
    gating_factor = 1.0e-02 : f64, norm_eps = 1.0e-06 : f64, dtype = f32, seed = 7>} {
  // expected-error @+1 {{input width 6 must be C = 8}}
  %x = mhc.expand %e {node = "expand"} : tensor<4x6xf32> -> tensor<4x16xf32>
  return
}

// -----

func.func @expand_tokens(%e: tensor<4x8xf32>) attributes {mhc.config = #mhc.config<vocab = 16, hidden = 8, heads = 2, ffn_hidden = 24,
    seq_len = 4, micro_batch = 1, streams = 2, sinkhorn_iterations = 3,
    gating_factor = 1.0e-02 : f64, norm_eps = 1.0e-06 : f64, dtype = f32, seed = 7>} {
  // expected-error @+1 {{result has 5 tokens but the op's input has 4}}
  %x = mhc.expand %e {node = "expand"} : tensor<4x8xf32> -> tensor<5x16xf32>
  return
}

// -----

func.func @contract_width(%x: tensor<4x16xf32>) attributes {mhc.config = #mhc.config<vocab = 16, hidden = 8, heads = 2, ffn_hidden = 24,
    seq_len = 4, micro_batch = 1, streams = 4, sinkhorn_iterations = 3,
    gating_factor = 1.0e-02 : f64, norm_eps = 1.0e-06 : f64, dtype = f32, seed = 7>} {
  // expected-error @+1 {{input width 16 must be n*C = 4*8 = 32}}
  %c = mhc.contract %x {node = "contract"} : tensor<4x16xf32> -> tensor<4x8xf32>
  return
}

// -----

func.func @residual_width(%x: tensor<4x10xf32>) attributes {mhc.config = #mhc.config<vocab = 16, hidden = 8, heads = 2, ffn_hidden = 24,
    seq_len = 4, micro_batch = 1, streams = 4, sinkhorn_iterations = 3,
    gating_factor = 1.0e-02 : f64, norm_eps = 1.0e-06 : f64, dtype = f32, seed = 7>} {
  // expected-error @+1 {{residual width 10 must be n*C = 4*8 = 32}}
  %r = mhc.hyper_connection %x {node = "l0.attn", layer = 0} : tensor<4x10xf32> {
  ^bb0(%u: tensor<4x8xf32>):
    %y = mhc.attention %u {node = "attn"} : tensor<4x8xf32>
    mhc.yield %y : tensor<4x8xf32>
  }
  return
}

// -----

func.func @body_argument_width(%x: tensor<4x16xf32>) attributes {mhc.config = #mhc.config<vocab = 16, hidden = 8, heads = 2, ffn_hidden = 24,
    seq_len = 4, micro_batch = 1, streams = 2, sinkhorn_iterations = 3,
    gating_factor = 1.0e-02 : f64, norm_eps = 1.0e-06 : f64, dtype = f32, seed = 7>} {
  // expected-error @+1 {{body must take one argument u of type 'tensor<4x8xf32>' (the C-wide sublayer input)}}
  %r = mhc.hyper_connection %x {node = "l0.attn", layer = 0} : tensor<4x16xf32> {
  ^bb0(%u: tensor<4x16xf32>):
    mhc.yield %u : tensor<4x16xf32>
  }
  return
}

// -----

func.func @yield_width(%x: tensor<4x16xf32>, %w: tensor<4x4xf32>) attributes {mhc.config = #mhc.config<vocab = 16, hidden = 8, heads = 2, ffn_hidden = 24,
    seq_len = 4, micro_batch = 1, streams = 2, sinkhorn_iterations = 3,
    gating_factor = 1.0e-02 : f64, norm_eps = 1.0e-06 : f64, dtype = f32, seed = 7>} {
  // expected-error @+1 {{body must yield 'tensor<4x8xf32>', got 'tensor<4x4xf32>'}}
  %r = mhc.hyper_connection %x {node = "l0.attn", layer = 0} : tensor<4x16xf32> {
  ^bb0(%u: tensor<4x8xf32>):
    %y = mhc.attention %u {node = "attn"} : tensor<4x8xf32>
    mhc.yield %w : tensor<4x4xf32>
  }
  return
}

// -----

func.func @empty_body(%x: tensor<4x16xf32>) attributes {mhc.config = #mhc.config<vocab = 16, hidden = 8, heads = 2, ffn_hidden = 24,
    seq_len = 4, micro_batch = 1, streams = 2, sinkhorn_iterations = 3,
    gating_factor = 1.0e-02 : f64, norm_eps = 1.0e-06 : f64, dtype = f32, seed = 7>} {
  // expected-error @+1 {{body holds none of mhc.attention, mhc.gated_delta_net and mhc.swiglu_mlp}}
  %r = mhc.hyper_connection %x {node = "l0.attn", layer = 0} : tensor<4x16xf32> {
  ^bb0(%u: tensor<4x8xf32>):
    mhc.yield %u : tensor<4x8xf32>
  }
  return
}

// -----

func.func @yield_outside(%u: tensor<4x8xf32>) attributes {mhc.config = #mhc.config<vocab = 16, hidden = 8, heads = 2, ffn_hidden = 24,
    seq_len = 4, micro_batch = 1, streams = 2, sinkhorn_iterations = 3,
    gating_factor = 1.0e-02 : f64, norm_eps = 1.0e-06 : f64, dtype = f32, seed = 7>} {
  // expected-error @+1 {{expects parent op 'mhc.hyper_connection'}}
  mhc.yield %u : tensor<4x8xf32>
}

// -----

func.func @attention_width(%u: tensor<4x12xf32>) attributes {mhc.config = #mhc.config<vocab = 16, hidden = 8, heads = 2, ffn_hidden = 24,
    seq_len = 4, micro_batch = 1, streams = 2, sinkhorn_iterations = 3,
    gating_factor = 1.0e-02 : f64, norm_eps = 1.0e-06 : f64, dtype = f32, seed = 7>} {
  // expected-error @+1 {{input width 12 must be C = 8}}
  %y = mhc.attention %u {node = "attn"} : tensor<4x12xf32>
  return
}

// -----

func.func @seq_len_does_not_divide_tokens(%u: tensor<6x8xf32>) attributes {mhc.config = #mhc.config<vocab = 16, hidden = 8, heads = 2, ffn_hidden = 24,
    seq_len = 4, micro_batch = 1, streams = 2, sinkhorn_iterations = 3,
    gating_factor = 1.0e-02 : f64, norm_eps = 1.0e-06 : f64, dtype = f32, seed = 7>} {
  // expected-error @+1 {{tokens T = 6 must be a multiple of seq_len = 4}}
  %y = mhc.attention %u {node = "attn"} : tensor<6x8xf32>
  return
}

// -----

func.func @mlp_width(%u: tensor<4x16xf32>) attributes {mhc.config = #mhc.config<vocab = 16, hidden = 8, heads = 2, ffn_hidden = 24,
    seq_len = 4, micro_batch = 1, streams = 2, sinkhorn_iterations = 3,
    gating_factor = 1.0e-02 : f64, norm_eps = 1.0e-06 : f64, dtype = f32, seed = 7>} {
  // expected-error @+1 {{input width 16 must be C = 8}}
  %y = mhc.swiglu_mlp %u {node = "mlp"} : tensor<4x16xf32>
  return
}

// -----

func.func @rms_norm_width(%u: tensor<4x16xf32>) attributes {mhc.config = #mhc.config<vocab = 16, hidden = 8, heads = 2, ffn_hidden = 24,
    seq_len = 4, micro_batch = 1, streams = 2, sinkhorn_iterations = 3,
    gating_factor = 1.0e-02 : f64, norm_eps = 1.0e-06 : f64, dtype = f32, seed = 7>} {
  // expected-error @+1 {{input width 16 must be C = 8}}
  %y = mhc.rms_norm %u {node = "norm", eps = 1.0e-06} : tensor<4x16xf32>
  return
}

// -----

func.func @lm_head_vocab(%f: tensor<4x8xf32>) attributes {mhc.config = #mhc.config<vocab = 16, hidden = 8, heads = 2, ffn_hidden = 24,
    seq_len = 4, micro_batch = 1, streams = 2, sinkhorn_iterations = 3,
    gating_factor = 1.0e-02 : f64, norm_eps = 1.0e-06 : f64, dtype = f32, seed = 7>} {
  // expected-error @+1 {{result width 15 must be V = 16}}
  %h = mhc.lm_head %f {node = "head"} : tensor<4x8xf32> -> tensor<4x15xf32>
  return
}

// -----

func.func @labels_tokens(%h: tensor<4x16xf32>, %labels: tensor<3xi32>) attributes {mhc.config = #mhc.config<vocab = 16, hidden = 8, heads = 2, ffn_hidden = 24,
    seq_len = 4, micro_batch = 1, streams = 2, sinkhorn_iterations = 3,
    gating_factor = 1.0e-02 : f64, norm_eps = 1.0e-06 : f64, dtype = f32, seed = 7>} {
  // expected-error @+1 {{labels has 3 tokens but the op's input has 4}}
  %l = mhc.cross_entropy %h, %labels {node = "loss", loss_name = "lm loss"}
      : tensor<4x16xf32>, tensor<3xi32> -> tensor<f32>
  return
}

// -----

func.func @logits_vocab(%h: tensor<4x12xf32>, %labels: tensor<4xi32>) attributes {mhc.config = #mhc.config<vocab = 16, hidden = 8, heads = 2, ffn_hidden = 24,
    seq_len = 4, micro_batch = 1, streams = 2, sinkhorn_iterations = 3,
    gating_factor = 1.0e-02 : f64, norm_eps = 1.0e-06 : f64, dtype = f32, seed = 7>} {
  // expected-error @+1 {{logits width 12 must be V = 16}}
  %l = mhc.cross_entropy %h, %labels {node = "loss", loss_name = "lm loss"}
      : tensor<4x12xf32>, tensor<4xi32> -> tensor<f32>
  return
}

// -----

func.func @embedding_tokens(%tokens: tensor<4xi32>) attributes {mhc.config = #mhc.config<vocab = 16, hidden = 8, heads = 2, ffn_hidden = 24,
    seq_len = 4, micro_batch = 1, streams = 2, sinkhorn_iterations = 3,
    gating_factor = 1.0e-02 : f64, norm_eps = 1.0e-06 : f64, dtype = f32, seed = 7>} {
  // expected-error @+1 {{result has 8 tokens but the op's input has 4}}
  %e = mhc.embedding %tokens {node = "embed"} : tensor<4xi32> -> tensor<8x8xf32>
  return
}

// -----

func.func @mtp_width(%m: tensor<4x8xf32>, %t: tensor<4xi32>) attributes {mhc.config = #mhc.config<vocab = 16, hidden = 8, heads = 2, ffn_hidden = 24,
    seq_len = 4, micro_batch = 1, streams = 2, sinkhorn_iterations = 3,
    gating_factor = 1.0e-02 : f64, norm_eps = 1.0e-06 : f64, dtype = f32, seed = 7>} {
  // expected-error @+1 {{residual width 8 must be n*C = 2*8 = 16}}
  %l = mhc.mtp %m, %t, %t {node = "mtp1", depth = 1, loss_weight = 1.0e-01}
      : tensor<4x8xf32>, tensor<4xi32>, tensor<4xi32> -> tensor<f32>
  return
}

// -----

func.func @mtp_loss_weight(%m: tensor<4x16xf32>, %t: tensor<4xi32>) attributes {mhc.config = #mhc.config<vocab = 16, hidden = 8, heads = 2, ffn_hidden = 24,
    seq_len = 4, micro_batch = 1, streams = 2, sinkhorn_iterations = 3,
    gating_factor = 1.0e-02 : f64, norm_eps = 1.0e-06 : f64, dtype = f32, seed = 7>} {
  // expected-error @+1 {{loss_weight must be positive}}
  %l = mhc.mtp %m, %t, %t {node = "mtp1", depth = 1, loss_weight = 0.0}
      : tensor<4x16xf32>, tensor<4xi32>, tensor<4xi32> -> tensor<f32>
  return
}

// -----

func.func @mixed_element_types(%e: tensor<4x8xbf16>) attributes {mhc.config = #mhc.config<vocab = 16, hidden = 8, heads = 2, ffn_hidden = 24,
    seq_len = 4, micro_batch = 1, streams = 2, sinkhorn_iterations = 3,
    gating_factor = 1.0e-02 : f64, norm_eps = 1.0e-06 : f64, dtype = f32, seed = 7>} {
  // expected-error @+1 {{element types differ}}
  %x = mhc.expand %e {node = "expand"} : tensor<4x8xbf16> -> tensor<4x16xf32>
  return
}

// -----

// expected-error @+1 {{hidden (12) must be divisible by heads (5)}}
func.func @bad_config() attributes {mhc.config = #mhc.config<vocab = 16, hidden = 12, heads = 5,
    ffn_hidden = 24, seq_len = 4, micro_batch = 1, streams = 2, sinkhorn_iterations = 3,
    gating_factor = 1.0e-02 : f64, norm_eps = 1.0e-06 : f64, dtype = f32, seed = 7>} {
  return
}

// -----

// expected-error @+1 {{head dimension hidden/heads = 3 must be even for rotary positions}}
func.func @odd_head_dim() attributes {mhc.config = #mhc.config<vocab = 16, hidden = 12, heads = 4,
    ffn_hidden = 24, seq_len = 4, micro_batch = 1, streams = 2, sinkhorn_iterations = 3,
    gating_factor = 1.0e-02 : f64, norm_eps = 1.0e-06 : f64, dtype = f32, seed = 7>} {
  return
}

// -----

// expected-error @+1 {{streams (n) must be at least 1, got 0}}
func.func @zero_streams_config() attributes {mhc.config = #mhc.config<vocab = 16, hidden = 8, heads = 2,
    ffn_hidden = 24, seq_len = 4, micro_batch = 1, streams = 0, sinkhorn_iterations = 3,
    gating_factor = 1.0e-02 : f64, norm_eps = 1.0e-06 : f64, dtype = f32, seed = 7>} {
  return
}

// -----

// expected-error @+1 {{sinkhorn_iterations must be at least 1, got 0}}
func.func @zero_sinkhorn_config() attributes {mhc.config = #mhc.config<vocab = 16, hidden = 8, heads = 2,
    ffn_hidden = 24, seq_len = 4, micro_batch = 1, streams = 2, sinkhorn_iterations = 0,
    gating_factor = 1.0e-02 : f64, norm_eps = 1.0e-06 : f64, dtype = f32, seed = 7>} {
  return
}

// -----

// expected-error @+1 {{gating_factor must be positive and finite}}
func.func @negative_gating_config() attributes {mhc.config = #mhc.config<vocab = 16, hidden = 8, heads = 2,
    ffn_hidden = 24, seq_len = 4, micro_batch = 1, streams = 2, sinkhorn_iterations = 3,
    gating_factor = -1.0e-02 : f64, norm_eps = 1.0e-06 : f64, dtype = f32, seed = 7>} {
  return
}

// -----

func.func @gdn_width(%x: tensor<4x16xf32>) attributes {mhc.config = #mhc.config<vocab = 16, hidden = 8, heads = 2, ffn_hidden = 24,
    seq_len = 4, micro_batch = 1, streams = 2, sinkhorn_iterations = 3,
    gating_factor = 1.0e-02 : f64, norm_eps = 1.0e-06 : f64, dtype = f32, seed = 7>} {
  // expected-error @+1 {{input width 16 must be C = 8}}
  %y = mhc.gated_delta_net %x {node = "l0.gdn.gdn"} : tensor<4x16xf32>
  return
}

// -----

func.func @gdn_partial_sequence(%x: tensor<6x8xf32>) attributes {mhc.config = #mhc.config<vocab = 16, hidden = 8, heads = 2, ffn_hidden = 24,
    seq_len = 4, micro_batch = 1, streams = 2, sinkhorn_iterations = 3,
    gating_factor = 1.0e-02 : f64, norm_eps = 1.0e-06 : f64, dtype = f32, seed = 7>} {
  // expected-error @+1 {{tokens T = 6 must be a multiple of seq_len = 4}}
  %y = mhc.gated_delta_net %x {node = "l0.gdn.gdn"} : tensor<6x8xf32>
  return
}

// -----

// With residual_dtype = f32 in a bf16 model the residual stream is f32.
func.func @residual_not_f32(%e: tensor<4x8xbf16>) attributes {mhc.config = #mhc.config<vocab = 16, hidden = 8, heads = 2, ffn_hidden = 24,
    seq_len = 4, micro_batch = 1, streams = 2, sinkhorn_iterations = 3,
    gating_factor = 1.0e-02 : f64, norm_eps = 1.0e-06 : f64, dtype = bf16, residual_dtype = f32, seed = 7>} {
  // expected-error @+1 {{element types differ from #mhc.config: result 'tensor<4x16xbf16>' must hold 'f32' (residual_dtype)}}
  %x = mhc.expand %e {node = "expand"} : tensor<4x8xbf16> -> tensor<4x16xbf16>
  return
}

// -----

// expected-error @+1 {{residual_dtype = bf16 needs dtype = bf16 (an f32 model keeps its residual in f32)}}
func.func @residual_narrower(%e: tensor<4x8xf32>) attributes {mhc.config = #mhc.config<vocab = 16, hidden = 8, heads = 2, ffn_hidden = 24,
    seq_len = 4, micro_batch = 1, streams = 2, sinkhorn_iterations = 3,
    gating_factor = 1.0e-02 : f64, norm_eps = 1.0e-06 : f64, dtype = f32, residual_dtype = bf16, seed = 7>} {
  return
}

// -----

// The contract reads the residual stream in residual_dtype.
func.func @contract_input_not_f32(%x: tensor<4x16xbf16>) attributes {mhc.config = #mhc.config<vocab = 16, hidden = 8, heads = 2, ffn_hidden = 24,
    seq_len = 4, micro_batch = 1, streams = 2, sinkhorn_iterations = 3,
    gating_factor = 1.0e-02 : f64, norm_eps = 1.0e-06 : f64, dtype = bf16, residual_dtype = f32, seed = 7>} {
  // expected-error @+1 {{element types differ from #mhc.config: input 'tensor<4x16xbf16>' must hold 'f32' (residual_dtype)}}
  %h = mhc.contract %x {node = "contract"} : tensor<4x16xbf16> -> tensor<4x8xbf16>
  return
}

// -----

// A hyper-connection's residual is in residual_dtype ...
func.func @hyper_connection_residual_not_f32(%x: tensor<4x16xbf16>) attributes {mhc.config = #mhc.config<vocab = 16, hidden = 8, heads = 2, ffn_hidden = 24,
    seq_len = 4, micro_batch = 1, streams = 2, sinkhorn_iterations = 3,
    gating_factor = 1.0e-02 : f64, norm_eps = 1.0e-06 : f64, dtype = bf16, residual_dtype = f32, seed = 7>} {
  // expected-error @+1 {{element types differ from #mhc.config: residual 'tensor<4x16xbf16>' must hold 'f32' (residual_dtype)}}
  %a = mhc.hyper_connection %x {node = "l0.attn", layer = 0} : tensor<4x16xbf16> {
  ^bb0(%u: tensor<4x8xbf16>):
    %n = mhc.rms_norm %u {node = "l0.attn.norm", eps = 1.0e-06} : tensor<4x8xbf16>
    mhc.yield %n : tensor<4x8xbf16>
  }
  return
}

// -----

// ... and its body reads u in dtype, not in the residual's.
func.func @hyper_connection_body_in_residual_dtype(%x: tensor<4x16xf32>) attributes {mhc.config = #mhc.config<vocab = 16, hidden = 8, heads = 2, ffn_hidden = 24,
    seq_len = 4, micro_batch = 1, streams = 2, sinkhorn_iterations = 3,
    gating_factor = 1.0e-02 : f64, norm_eps = 1.0e-06 : f64, dtype = bf16, residual_dtype = f32, seed = 7>} {
  // expected-error @+1 {{body must take one argument u of type 'tensor<4x8xbf16>' (the C-wide sublayer input)}}
  %a = mhc.hyper_connection %x {node = "l0.attn", layer = 0} : tensor<4x16xf32> {
  ^bb0(%u: tensor<4x8xf32>):
    %n = mhc.rms_norm %u {node = "l0.attn.norm", eps = 1.0e-06} : tensor<4x8xf32>
    mhc.yield %n : tensor<4x8xf32>
  }
  return
}

// -----

// An MTP module reads the residual stream in residual_dtype.
func.func @mtp_residual_not_f32(%m: tensor<4x16xbf16>, %t: tensor<4xi32>) attributes {mhc.config = #mhc.config<vocab = 16, hidden = 8, heads = 2, ffn_hidden = 24,
    seq_len = 4, micro_batch = 1, streams = 2, sinkhorn_iterations = 3,
    gating_factor = 1.0e-02 : f64, norm_eps = 1.0e-06 : f64, dtype = bf16, residual_dtype = f32, seed = 7>} {
  // expected-error @+1 {{element types differ from #mhc.config: residual 'tensor<4x16xbf16>' must hold 'f32' (residual_dtype)}}
  %l = mhc.mtp %m, %t, %t {node = "mtp1", depth = 1, loss_weight = 1.0e-01}
      : tensor<4x16xbf16>, tensor<4xi32>, tensor<4xi32> -> tensor<f32>
  return
}

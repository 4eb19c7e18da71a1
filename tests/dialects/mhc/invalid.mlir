// RUN: mhc-opt %s --split-input-file --verify-diagnostics

func.func @expand_width(%e: tensor<4x8xf32>) {
  // expected-error @+1 {{result width 24 must be n*C = 2*8 = 16}}
  %x = mhc.expand %e {node = "expand", streams = 2} : tensor<4x8xf32> -> tensor<4x24xf32>
  return
}

// -----

func.func @expand_tokens(%e: tensor<4x8xf32>) {
  // expected-error @+1 {{result has 5 tokens but the op's input has 4}}
  %x = mhc.expand %e {node = "expand", streams = 2} : tensor<4x8xf32> -> tensor<5x16xf32>
  return
}

// -----

func.func @zero_streams(%e: tensor<4x8xf32>) {
  // expected-error @+1 {{attribute 'streams' failed to satisfy constraint: 64-bit signless integer attribute whose minimum value is 1}}
  %x = mhc.expand %e {node = "expand", streams = 0} : tensor<4x8xf32> -> tensor<4x8xf32>
  return
}

// -----

func.func @contract_width(%x: tensor<4x16xf32>) {
  // expected-error @+1 {{input width 16 must be n*C = 4*8 = 32}}
  %c = mhc.contract %x {node = "contract", streams = 4} : tensor<4x16xf32> -> tensor<4x8xf32>
  return
}

// -----

func.func @residual_not_multiple(%x: tensor<4x10xf32>) {
  // expected-error @+1 {{residual width 10 is not a multiple of streams n = 4}}
  %r = mhc.hyper_connection %x {node = "l0.attn", streams = 4, sinkhorn_iterations = 20,
      gating_factor = 1.0e-02, layer = 0} : tensor<4x10xf32> {
  ^bb0(%u: tensor<4x2xf32>):
    %y = mhc.attention %u {node = "attn", num_heads = 1, seq_len = 4} : tensor<4x2xf32>
    mhc.yield %y : tensor<4x2xf32>
  }
  return
}

// -----

func.func @body_argument_width(%x: tensor<4x16xf32>) {
  // expected-error @+1 {{body must take one argument u of type 'tensor<4x8xf32>' (the C-wide sublayer input)}}
  %r = mhc.hyper_connection %x {node = "l0.attn", streams = 2, sinkhorn_iterations = 20,
      gating_factor = 1.0e-02, layer = 0} : tensor<4x16xf32> {
  ^bb0(%u: tensor<4x16xf32>):
    %y = mhc.attention %u {node = "attn", num_heads = 2, seq_len = 4} : tensor<4x16xf32>
    mhc.yield %y : tensor<4x16xf32>
  }
  return
}

// -----

func.func @yield_width(%x: tensor<4x16xf32>, %w: tensor<4x4xf32>) {
  // expected-error @+1 {{body must yield 'tensor<4x8xf32>', got 'tensor<4x4xf32>'}}
  %r = mhc.hyper_connection %x {node = "l0.attn", streams = 2, sinkhorn_iterations = 20,
      gating_factor = 1.0e-02, layer = 0} : tensor<4x16xf32> {
  ^bb0(%u: tensor<4x8xf32>):
    %y = mhc.attention %u {node = "attn", num_heads = 2, seq_len = 4} : tensor<4x8xf32>
    mhc.yield %w : tensor<4x4xf32>
  }
  return
}

// -----

func.func @empty_body(%x: tensor<4x16xf32>) {
  // expected-error @+1 {{body holds neither mhc.attention nor mhc.swiglu_mlp}}
  %r = mhc.hyper_connection %x {node = "l0.attn", streams = 2, sinkhorn_iterations = 20,
      gating_factor = 1.0e-02, layer = 0} : tensor<4x16xf32> {
  ^bb0(%u: tensor<4x8xf32>):
    mhc.yield %u : tensor<4x8xf32>
  }
  return
}

// -----

func.func @zero_sinkhorn(%x: tensor<4x16xf32>) {
  // expected-error @+1 {{attribute 'sinkhorn_iterations' failed to satisfy constraint}}
  %r = mhc.hyper_connection %x {node = "l0.attn", streams = 2, sinkhorn_iterations = 0,
      gating_factor = 1.0e-02, layer = 0} : tensor<4x16xf32> {
  ^bb0(%u: tensor<4x8xf32>):
    %y = mhc.attention %u {node = "attn", num_heads = 2, seq_len = 4} : tensor<4x8xf32>
    mhc.yield %y : tensor<4x8xf32>
  }
  return
}

// -----

func.func @negative_gating(%x: tensor<4x16xf32>) {
  // expected-error @+1 {{gating_factor must be positive}}
  %r = mhc.hyper_connection %x {node = "l0.attn", streams = 2, sinkhorn_iterations = 2,
      gating_factor = -1.0e-02, layer = 0} : tensor<4x16xf32> {
  ^bb0(%u: tensor<4x8xf32>):
    %y = mhc.attention %u {node = "attn", num_heads = 2, seq_len = 4} : tensor<4x8xf32>
    mhc.yield %y : tensor<4x8xf32>
  }
  return
}

// -----

func.func @yield_outside(%u: tensor<4x8xf32>) {
  // expected-error @+1 {{expects parent op 'mhc.hyper_connection'}}
  mhc.yield %u : tensor<4x8xf32>
}

// -----

func.func @heads_do_not_divide(%u: tensor<4x12xf32>) {
  // expected-error @+1 {{hidden size C = 12 is not divisible by num_heads = 5}}
  %y = mhc.attention %u {node = "attn", num_heads = 5, seq_len = 4} : tensor<4x12xf32>
  return
}

// -----

func.func @odd_head_dim(%u: tensor<4x12xf32>) {
  // expected-error @+1 {{head dimension 3 must be even for rotary positions}}
  %y = mhc.attention %u {node = "attn", num_heads = 4, seq_len = 4} : tensor<4x12xf32>
  return
}

// -----

func.func @seq_len_does_not_divide_tokens(%u: tensor<6x8xf32>) {
  // expected-error @+1 {{tokens T = 6 must be a multiple of seq_len = 4}}
  %y = mhc.attention %u {node = "attn", num_heads = 2, seq_len = 4} : tensor<6x8xf32>
  return
}

// -----

func.func @zero_ffn(%u: tensor<4x8xf32>) {
  // expected-error @+1 {{attribute 'ffn_hidden' failed to satisfy constraint}}
  %y = mhc.swiglu_mlp %u {node = "mlp", ffn_hidden = 0} : tensor<4x8xf32>
  return
}

// -----

func.func @lm_head_vocab(%f: tensor<4x8xf32>) {
  // expected-error @+1 {{result width 15 must equal vocab = 16}}
  %h = mhc.lm_head %f {node = "head", vocab = 16} : tensor<4x8xf32> -> tensor<4x15xf32>
  return
}

// -----

func.func @labels_tokens(%h: tensor<4x16xf32>, %labels: tensor<3xi32>) {
  // expected-error @+1 {{labels has 3 tokens but the op's input has 4}}
  %l = mhc.cross_entropy %h, %labels {node = "loss", loss_name = "lm loss"}
      : tensor<4x16xf32>, tensor<3xi32> -> tensor<f32>
  return
}

// -----

func.func @embedding_tokens(%tokens: tensor<4xi32>) {
  // expected-error @+1 {{result has 8 tokens but the op's input has 4}}
  %e = mhc.embedding %tokens {node = "embed", vocab = 16} : tensor<4xi32> -> tensor<8x8xf32>
  return
}

// -----

func.func @mtp_heads(%m: tensor<4x16xf32>, %t: tensor<4xi32>) {
  // expected-error @+1 {{hidden size C = 8 is not divisible by num_heads = 3}}
  %l = mhc.mtp %m, %t, %t {node = "mtp1", depth = 1, streams = 2, num_heads = 3,
      ffn_hidden = 24, vocab = 16, sinkhorn_iterations = 3, loss_weight = 1.0e-01}
      : tensor<4x16xf32>, tensor<4xi32>, tensor<4xi32> -> tensor<f32>
  return
}

// -----

func.func @mixed_element_types(%e: tensor<4x8xbf16>) {
  // expected-error @+1 {{element types differ}}
  %x = mhc.expand %e {node = "expand", streams = 2} : tensor<4x8xbf16> -> tensor<4x16xf32>
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

// expected-error @+1 {{streams (n) must be at least 1, got 0}}
func.func @zero_streams_config() attributes {mhc.config = #mhc.config<vocab = 16, hidden = 8, heads = 2,
    ffn_hidden = 24, seq_len = 4, micro_batch = 1, streams = 0, sinkhorn_iterations = 3,
    gating_factor = 1.0e-02 : f64, norm_eps = 1.0e-06 : f64, dtype = f32, seed = 7>} {
  return
}

// -----

// expected-error @+1 {{sinkhorn_iterations must be at least 1, got 0}}
func.func @zero_sinkhorn_config() attributes {mhc.config = #mhc.config<vocab = 16, hidden = 8, heads = 2,
    ffn_hidden = 24, seq_len = 4, micro_batch = 1, streams = 4, sinkhorn_iterations = 0,
    gating_factor = 1.0e-02 : f64, norm_eps = 1.0e-06 : f64, dtype = f32, seed = 7>} {
  return
}

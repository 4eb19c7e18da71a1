// RUN: mhc-opt %s --split-input-file --pipe-verify-schedule --verify-diagnostics

// The model: one layer, C = 8, n = 2, layout E|tL on two ranks; the
// boundary before mhc.expand is C = 8 wide.

// A valid 1F1B list for one microbatch: no diagnostics.
func.func @m(%tokens: tensor<4xi32>, %labels: tensor<4xi32>) -> tensor<f32>
    attributes {mhc.config = #mhc.config<vocab = 16, hidden = 8, heads = 2, ffn_hidden = 24,
        seq_len = 4, micro_batch = 1, streams = 2, sinkhorn_iterations = 3,
        gating_factor = 1.0e-02 : f64, norm_eps = 1.0e-06 : f64, dtype = f32, seed = 7>,
        pipe.layout = "E|tL", pipe.pp = 2 : i64, pipe.vpp = 1 : i64} {
  %e = mhc.embedding %tokens {node = "embed", pipe.stage = 0 : i64} : tensor<4xi32> -> tensor<4x8xf32>
  %b = pipe.boundary %e stage 0 -> 1 rank 0 -> 1 : tensor<4x8xf32>
  %x = mhc.expand %b {node = "expand", pipe.stage = 1 : i64} : tensor<4x8xf32> -> tensor<4x16xf32>
  %a = mhc.hyper_connection %x {node = "l0.attn", layer = 0, pipe.stage = 1 : i64} : tensor<4x16xf32> {
  ^bb0(%u: tensor<4x8xf32>):
    %y = mhc.attention %u {node = "attn"} : tensor<4x8xf32>
    mhc.yield %y : tensor<4x8xf32>
  }
  %f = mhc.hyper_connection %a {node = "l0.mlp", layer = 0, pipe.stage = 1 : i64} : tensor<4x16xf32> {
  ^bb0(%u: tensor<4x8xf32>):
    %y = mhc.swiglu_mlp %u {node = "mlp"} : tensor<4x8xf32>
    mhc.yield %y : tensor<4x8xf32>
  }
  %c = mhc.contract %f {node = "contract", pipe.stage = 1 : i64} : tensor<4x16xf32> -> tensor<4x8xf32>
  %n = mhc.rms_norm %c {node = "norm", eps = 1.0e-06, pipe.stage = 1 : i64} : tensor<4x8xf32>
  %h = mhc.lm_head %n {node = "head", pipe.stage = 1 : i64} : tensor<4x8xf32> -> tensor<4x16xf32>
  %l = mhc.cross_entropy %h, %labels {node = "loss", loss_name = "lm loss", pipe.stage = 1 : i64}
      : tensor<4x16xf32>, tensor<4xi32> -> tensor<f32>
  return %l : tensor<f32>
}
pipe.schedule "1f1b" for @m attributes {group_size = 0, microbatches = 1, pp = 2, vpp = 1} {
  pipe.rank 0 {
    pipe.forward stage 0 mb 0
    pipe.send "act" stage 0 -> 1 mb 0 peer 1 group 0 order 0 : tensor<4x8xf32>
    pipe.free stage 0 mb 0
    pipe.recv "grad" stage 1 -> 0 mb 0 peer 1 group 1 order 0 : tensor<4x8xf32>
    pipe.backward stage 0 mb 0
    pipe.optimizer
  }
  pipe.rank 1 {
    pipe.recv "act" stage 0 -> 1 mb 0 peer 0 group 0 order 0 : tensor<4x8xf32>
    pipe.forward stage 1 mb 0
    pipe.backward stage 1 mb 0
    pipe.send "grad" stage 1 -> 0 mb 0 peer 0 group 1 order 0 : tensor<4x8xf32>
    pipe.optimizer
  }
}

// -----

// Rank 0 waits for a gradient before sending the activation it depends on.
func.func @m(%tokens: tensor<4xi32>, %labels: tensor<4xi32>) -> tensor<f32>
    attributes {mhc.config = #mhc.config<vocab = 16, hidden = 8, heads = 2, ffn_hidden = 24,
        seq_len = 4, micro_batch = 1, streams = 2, sinkhorn_iterations = 3,
        gating_factor = 1.0e-02 : f64, norm_eps = 1.0e-06 : f64, dtype = f32, seed = 7>,
        pipe.layout = "E|tL", pipe.pp = 2 : i64, pipe.vpp = 1 : i64} {
  %e = mhc.embedding %tokens {node = "embed", pipe.stage = 0 : i64} : tensor<4xi32> -> tensor<4x8xf32>
  %b = pipe.boundary %e stage 0 -> 1 rank 0 -> 1 : tensor<4x8xf32>
  %x = mhc.expand %b {node = "expand", pipe.stage = 1 : i64} : tensor<4x8xf32> -> tensor<4x16xf32>
  %a = mhc.hyper_connection %x {node = "l0.attn", layer = 0, pipe.stage = 1 : i64} : tensor<4x16xf32> {
  ^bb0(%u: tensor<4x8xf32>):
    %y = mhc.attention %u {node = "attn"} : tensor<4x8xf32>
    mhc.yield %y : tensor<4x8xf32>
  }
  %f = mhc.hyper_connection %a {node = "l0.mlp", layer = 0, pipe.stage = 1 : i64} : tensor<4x16xf32> {
  ^bb0(%u: tensor<4x8xf32>):
    %y = mhc.swiglu_mlp %u {node = "mlp"} : tensor<4x8xf32>
    mhc.yield %y : tensor<4x8xf32>
  }
  %c = mhc.contract %f {node = "contract", pipe.stage = 1 : i64} : tensor<4x16xf32> -> tensor<4x8xf32>
  %n = mhc.rms_norm %c {node = "norm", eps = 1.0e-06, pipe.stage = 1 : i64} : tensor<4x8xf32>
  %h = mhc.lm_head %n {node = "head", pipe.stage = 1 : i64} : tensor<4x8xf32> -> tensor<4x16xf32>
  %l = mhc.cross_entropy %h, %labels {node = "loss", loss_name = "lm loss", pipe.stage = 1 : i64}
      : tensor<4x16xf32>, tensor<4xi32> -> tensor<f32>
  return %l : tensor<f32>
}
pipe.schedule "1f1b" for @m attributes {group_size = 0, microbatches = 1, pp = 2, vpp = 1} {
  pipe.rank 0 {
    // expected-error @+1 {{rank 0 instruction #0: deadlock: RECV grad s1->s0 mb0 from r1 [4x8] is never matched (the peer never reaches it)}}
    pipe.recv "grad" stage 1 -> 0 mb 0 peer 1 group 0 order 0 : tensor<4x8xf32>
    pipe.forward stage 0 mb 0
    pipe.send "act" stage 0 -> 1 mb 0 peer 1 group 1 order 0 : tensor<4x8xf32>
    pipe.free stage 0 mb 0
    pipe.backward stage 0 mb 0
    pipe.optimizer
  }
  pipe.rank 1 {
    // expected-error @+1 {{rank 1 instruction #0: deadlock: RECV act s0->s1 mb0 from r0 [4x8] is never matched (the peer never reaches it)}}
    pipe.recv "act" stage 0 -> 1 mb 0 peer 0 group 0 order 0 : tensor<4x8xf32>
    pipe.forward stage 1 mb 0
    pipe.backward stage 1 mb 0
    pipe.send "grad" stage 1 -> 0 mb 0 peer 0 group 1 order 0 : tensor<4x8xf32>
    pipe.optimizer
  }
}

// -----

// An n*C-wide receive buffer for a C-wide message.
func.func @m(%tokens: tensor<4xi32>, %labels: tensor<4xi32>) -> tensor<f32>
    attributes {mhc.config = #mhc.config<vocab = 16, hidden = 8, heads = 2, ffn_hidden = 24,
        seq_len = 4, micro_batch = 1, streams = 2, sinkhorn_iterations = 3,
        gating_factor = 1.0e-02 : f64, norm_eps = 1.0e-06 : f64, dtype = f32, seed = 7>,
        pipe.layout = "E|tL", pipe.pp = 2 : i64, pipe.vpp = 1 : i64} {
  %e = mhc.embedding %tokens {node = "embed", pipe.stage = 0 : i64} : tensor<4xi32> -> tensor<4x8xf32>
  %b = pipe.boundary %e stage 0 -> 1 rank 0 -> 1 : tensor<4x8xf32>
  %x = mhc.expand %b {node = "expand", pipe.stage = 1 : i64} : tensor<4x8xf32> -> tensor<4x16xf32>
  %a = mhc.hyper_connection %x {node = "l0.attn", layer = 0, pipe.stage = 1 : i64} : tensor<4x16xf32> {
  ^bb0(%u: tensor<4x8xf32>):
    %y = mhc.attention %u {node = "attn"} : tensor<4x8xf32>
    mhc.yield %y : tensor<4x8xf32>
  }
  %f = mhc.hyper_connection %a {node = "l0.mlp", layer = 0, pipe.stage = 1 : i64} : tensor<4x16xf32> {
  ^bb0(%u: tensor<4x8xf32>):
    %y = mhc.swiglu_mlp %u {node = "mlp"} : tensor<4x8xf32>
    mhc.yield %y : tensor<4x8xf32>
  }
  %c = mhc.contract %f {node = "contract", pipe.stage = 1 : i64} : tensor<4x16xf32> -> tensor<4x8xf32>
  %n = mhc.rms_norm %c {node = "norm", eps = 1.0e-06, pipe.stage = 1 : i64} : tensor<4x8xf32>
  %h = mhc.lm_head %n {node = "head", pipe.stage = 1 : i64} : tensor<4x8xf32> -> tensor<4x16xf32>
  %l = mhc.cross_entropy %h, %labels {node = "loss", loss_name = "lm loss", pipe.stage = 1 : i64}
      : tensor<4x16xf32>, tensor<4xi32> -> tensor<f32>
  return %l : tensor<f32>
}
pipe.schedule "1f1b" for @m attributes {group_size = 0, microbatches = 1, pp = 2, vpp = 1} {
  pipe.rank 0 {
    pipe.forward stage 0 mb 0
    pipe.send "act" stage 0 -> 1 mb 0 peer 1 group 0 order 0 : tensor<4x8xf32>
    pipe.free stage 0 mb 0
    pipe.recv "grad" stage 1 -> 0 mb 0 peer 1 group 1 order 0 : tensor<4x8xf32>
    pipe.backward stage 0 mb 0
    pipe.optimizer
  }
  pipe.rank 1 {
    // expected-error @+1 {{rank 1 instruction #0: shape mismatch: RECV act s0->s1 mb0 from r0 [4x16] expects [4x16] but rank 0 #1 sends [4x8]}}
    pipe.recv "act" stage 0 -> 1 mb 0 peer 0 group 0 order 0 : tensor<4x16xf32>
    pipe.forward stage 1 mb 0
    pipe.backward stage 1 mb 0
    pipe.send "grad" stage 1 -> 0 mb 0 peer 0 group 1 order 0 : tensor<4x8xf32>
    pipe.optimizer
  }
}

// -----

// A sent output is sent again after its FREE.
func.func @m(%tokens: tensor<4xi32>, %labels: tensor<4xi32>) -> tensor<f32>
    attributes {mhc.config = #mhc.config<vocab = 16, hidden = 8, heads = 2, ffn_hidden = 24,
        seq_len = 4, micro_batch = 1, streams = 2, sinkhorn_iterations = 3,
        gating_factor = 1.0e-02 : f64, norm_eps = 1.0e-06 : f64, dtype = f32, seed = 7>,
        pipe.layout = "E|tL", pipe.pp = 2 : i64, pipe.vpp = 1 : i64} {
  %e = mhc.embedding %tokens {node = "embed", pipe.stage = 0 : i64} : tensor<4xi32> -> tensor<4x8xf32>
  %b = pipe.boundary %e stage 0 -> 1 rank 0 -> 1 : tensor<4x8xf32>
  %x = mhc.expand %b {node = "expand", pipe.stage = 1 : i64} : tensor<4x8xf32> -> tensor<4x16xf32>
  %a = mhc.hyper_connection %x {node = "l0.attn", layer = 0, pipe.stage = 1 : i64} : tensor<4x16xf32> {
  ^bb0(%u: tensor<4x8xf32>):
    %y = mhc.attention %u {node = "attn"} : tensor<4x8xf32>
    mhc.yield %y : tensor<4x8xf32>
  }
  %f = mhc.hyper_connection %a {node = "l0.mlp", layer = 0, pipe.stage = 1 : i64} : tensor<4x16xf32> {
  ^bb0(%u: tensor<4x8xf32>):
    %y = mhc.swiglu_mlp %u {node = "mlp"} : tensor<4x8xf32>
    mhc.yield %y : tensor<4x8xf32>
  }
  %c = mhc.contract %f {node = "contract", pipe.stage = 1 : i64} : tensor<4x16xf32> -> tensor<4x8xf32>
  %n = mhc.rms_norm %c {node = "norm", eps = 1.0e-06, pipe.stage = 1 : i64} : tensor<4x8xf32>
  %h = mhc.lm_head %n {node = "head", pipe.stage = 1 : i64} : tensor<4x8xf32> -> tensor<4x16xf32>
  %l = mhc.cross_entropy %h, %labels {node = "loss", loss_name = "lm loss", pipe.stage = 1 : i64}
      : tensor<4x16xf32>, tensor<4xi32> -> tensor<f32>
  return %l : tensor<f32>
}
pipe.schedule "1f1b" for @m attributes {group_size = 0, microbatches = 1, pp = 2, vpp = 1} {
  pipe.rank 0 {
    pipe.forward stage 0 mb 0
    pipe.send "act" stage 0 -> 1 mb 0 peer 1 group 0 order 0 : tensor<4x8xf32>
    pipe.free stage 0 mb 0
    // expected-error @+1 {{rank 0 instruction #3: SEND act s0->s1 mb0 to r1 [4x8]: use after FREE of out(s0,mb0)}}
    pipe.send "act" stage 0 -> 1 mb 0 peer 1 group 1 order 1 : tensor<4x8xf32>
    pipe.recv "grad" stage 1 -> 0 mb 0 peer 1 group 2 order 0 : tensor<4x8xf32>
    pipe.backward stage 0 mb 0
    pipe.optimizer
  }
  pipe.rank 1 {
    pipe.recv "act" stage 0 -> 1 mb 0 peer 0 group 0 order 0 : tensor<4x8xf32>
    pipe.forward stage 1 mb 0
    pipe.backward stage 1 mb 0
    pipe.send "grad" stage 1 -> 0 mb 0 peer 0 group 1 order 0 : tensor<4x8xf32>
    pipe.optimizer
  }
}

// -----

// A backward before its gradient's receive.
func.func @m(%tokens: tensor<4xi32>, %labels: tensor<4xi32>) -> tensor<f32>
    attributes {mhc.config = #mhc.config<vocab = 16, hidden = 8, heads = 2, ffn_hidden = 24,
        seq_len = 4, micro_batch = 1, streams = 2, sinkhorn_iterations = 3,
        gating_factor = 1.0e-02 : f64, norm_eps = 1.0e-06 : f64, dtype = f32, seed = 7>,
        pipe.layout = "E|tL", pipe.pp = 2 : i64, pipe.vpp = 1 : i64} {
  %e = mhc.embedding %tokens {node = "embed", pipe.stage = 0 : i64} : tensor<4xi32> -> tensor<4x8xf32>
  %b = pipe.boundary %e stage 0 -> 1 rank 0 -> 1 : tensor<4x8xf32>
  %x = mhc.expand %b {node = "expand", pipe.stage = 1 : i64} : tensor<4x8xf32> -> tensor<4x16xf32>
  %a = mhc.hyper_connection %x {node = "l0.attn", layer = 0, pipe.stage = 1 : i64} : tensor<4x16xf32> {
  ^bb0(%u: tensor<4x8xf32>):
    %y = mhc.attention %u {node = "attn"} : tensor<4x8xf32>
    mhc.yield %y : tensor<4x8xf32>
  }
  %f = mhc.hyper_connection %a {node = "l0.mlp", layer = 0, pipe.stage = 1 : i64} : tensor<4x16xf32> {
  ^bb0(%u: tensor<4x8xf32>):
    %y = mhc.swiglu_mlp %u {node = "mlp"} : tensor<4x8xf32>
    mhc.yield %y : tensor<4x8xf32>
  }
  %c = mhc.contract %f {node = "contract", pipe.stage = 1 : i64} : tensor<4x16xf32> -> tensor<4x8xf32>
  %n = mhc.rms_norm %c {node = "norm", eps = 1.0e-06, pipe.stage = 1 : i64} : tensor<4x8xf32>
  %h = mhc.lm_head %n {node = "head", pipe.stage = 1 : i64} : tensor<4x8xf32> -> tensor<4x16xf32>
  %l = mhc.cross_entropy %h, %labels {node = "loss", loss_name = "lm loss", pipe.stage = 1 : i64}
      : tensor<4x16xf32>, tensor<4xi32> -> tensor<f32>
  return %l : tensor<f32>
}
pipe.schedule "1f1b" for @m attributes {group_size = 0, microbatches = 1, pp = 2, vpp = 1} {
  pipe.rank 0 {
    pipe.forward stage 0 mb 0
    pipe.send "act" stage 0 -> 1 mb 0 peer 1 group 0 order 0 : tensor<4x8xf32>
    pipe.free stage 0 mb 0
    // expected-error @+1 {{rank 0 instruction #3: BWD(s0,mb0): its output gradient has not arrived}}
    pipe.backward stage 0 mb 0
    pipe.recv "grad" stage 1 -> 0 mb 0 peer 1 group 1 order 0 : tensor<4x8xf32>
    pipe.optimizer
  }
  pipe.rank 1 {
    pipe.recv "act" stage 0 -> 1 mb 0 peer 0 group 0 order 0 : tensor<4x8xf32>
    pipe.forward stage 1 mb 0
    pipe.backward stage 1 mb 0
    pipe.send "grad" stage 1 -> 0 mb 0 peer 0 group 1 order 0 : tensor<4x8xf32>
    pipe.optimizer
  }
}

// RUN: mhc-opt %s --split-input-file | mhc-opt --split-input-file | FileCheck %s
// RUN: mhc-opt %s --split-input-file --mlir-print-op-generic | mhc-opt --split-input-file | FileCheck %s

// A one-layer mHC model with n = 2 streams of C = 8 and an MTP module. The
// sizes live in #mhc.config only; the ops carry what differs per node.

// CHECK-LABEL: func.func @one_layer
// CHECK-SAME: mhc.config = #mhc.config<vocab = 16, hidden = 8, heads = 2, ffn_hidden = 24, seq_len = 4, micro_batch = 1, streams = 2, sinkhorn_iterations = 3
// CHECK: %[[E:.*]] = mhc.embedding %{{.*}} {node = "embed"} : tensor<4xi32> -> tensor<4x8xf32>
// CHECK: %[[X:.*]] = mhc.expand %[[E]] {node = "expand"} : tensor<4x8xf32> -> tensor<4x16xf32>
// CHECK: %[[A:.*]] = mhc.hyper_connection %[[X]] {{.*}}layer = 0 : i64, node = "l0.attn"{{.*}} : tensor<4x16xf32> {
// CHECK-NEXT: ^bb0(%[[U:.*]]: tensor<4x8xf32>):
// CHECK-NEXT: %[[N:.*]] = mhc.rms_norm %[[U]]
// CHECK-NEXT: %[[Y:.*]] = mhc.attention %[[N]] {node = "l0.attn.attention"}
// CHECK-NEXT: mhc.yield %[[Y]] : tensor<4x8xf32>
// CHECK: %[[M:.*]] = mhc.hyper_connection %[[A]]
// CHECK: mhc.swiglu_mlp %{{.*}} {node = "l0.mlp.mlp"} : tensor<4x8xf32>
// CHECK: %[[C:.*]] = mhc.contract %[[M]] {node = "contract"} : tensor<4x16xf32> -> tensor<4x8xf32>
// CHECK: %[[F:.*]] = mhc.rms_norm %[[C]]
// CHECK: %[[H:.*]] = mhc.lm_head %[[F]] {node = "head"} : tensor<4x8xf32> -> tensor<4x16xf32>
// CHECK: %[[L:.*]] = mhc.cross_entropy %[[H]], %{{.*}} {loss_name = "lm loss", node = "loss"} : tensor<4x16xf32>, tensor<4xi32> -> tensor<f32>
// CHECK: %[[T:.*]] = mhc.mtp %[[M]], %{{.*}}, %{{.*}} {depth = 1 : i64
// CHECK: return %[[L]], %[[T]] : tensor<f32>, tensor<f32>
func.func @one_layer(%tokens: tensor<4xi32>, %labels: tensor<4xi32>) -> (tensor<f32>, tensor<f32>)
    attributes {mhc.config = #mhc.config<vocab = 16, hidden = 8, heads = 2, ffn_hidden = 24,
        seq_len = 4, micro_batch = 1, streams = 2, sinkhorn_iterations = 3,
        gating_factor = 1.0e-02 : f64, norm_eps = 1.0e-06 : f64, dtype = f32, seed = 7>} {
  %e = mhc.embedding %tokens {node = "embed"} : tensor<4xi32> -> tensor<4x8xf32>
  %x = mhc.expand %e {node = "expand"} : tensor<4x8xf32> -> tensor<4x16xf32>
  %a = mhc.hyper_connection %x {node = "l0.attn", layer = 0} : tensor<4x16xf32> {
  ^bb0(%u: tensor<4x8xf32>):
    %n = mhc.rms_norm %u {node = "l0.attn.norm", eps = 1.0e-06} : tensor<4x8xf32>
    %y = mhc.attention %n {node = "l0.attn.attention"} : tensor<4x8xf32>
    mhc.yield %y : tensor<4x8xf32>
  }
  %m = mhc.hyper_connection %a {node = "l0.mlp", layer = 0} : tensor<4x16xf32> {
  ^bb0(%u: tensor<4x8xf32>):
    %n = mhc.rms_norm %u {node = "l0.mlp.norm", eps = 1.0e-06} : tensor<4x8xf32>
    %y = mhc.swiglu_mlp %n {node = "l0.mlp.mlp"} : tensor<4x8xf32>
    mhc.yield %y : tensor<4x8xf32>
  }
  %c = mhc.contract %m {node = "contract"} : tensor<4x16xf32> -> tensor<4x8xf32>
  %f = mhc.rms_norm %c {node = "final_norm", eps = 1.0e-06} : tensor<4x8xf32>
  %h = mhc.lm_head %f {node = "head"} : tensor<4x8xf32> -> tensor<4x16xf32>
  %l = mhc.cross_entropy %h, %labels {node = "loss", loss_name = "lm loss"}
      : tensor<4x16xf32>, tensor<4xi32> -> tensor<f32>
  %t = mhc.mtp %m, %tokens, %labels {node = "mtp1", depth = 1, loss_weight = 1.0e-01}
      : tensor<4x16xf32>, tensor<4xi32>, tensor<4xi32> -> tensor<f32>
  return %l, %t : tensor<f32>, tensor<f32>
}

// -----

// bf16 activations and a plain residual (n = 1) wrapper.
// CHECK-LABEL: func.func @plain_bf16
// CHECK-SAME: streams = 1
// CHECK: mhc.hyper_connection %{{.*}} {layer = 0 : i64, node = "l0.mlp"} : tensor<2x8xbf16>
func.func @plain_bf16(%x: tensor<2x8xbf16>) -> tensor<2x8xbf16>
    attributes {mhc.config = #mhc.config<vocab = 16, hidden = 8, heads = 2, ffn_hidden = 16,
        seq_len = 2, micro_batch = 1, streams = 1, sinkhorn_iterations = 1,
        gating_factor = 1.0e-02 : f64, norm_eps = 1.0e-06 : f64, dtype = bf16, seed = 7>} {
  %r = mhc.hyper_connection %x {node = "l0.mlp", layer = 0} : tensor<2x8xbf16> {
  ^bb0(%u: tensor<2x8xbf16>):
    %y = mhc.swiglu_mlp %u {node = "mlp"} : tensor<2x8xbf16>
    mhc.yield %y : tensor<2x8xbf16>
  }
  return %r : tensor<2x8xbf16>
}

// -----

// An fp32 residual around bf16 activations (residual_dtype): the wrapper's
// residual is f32, its body reads and yields bf16.
// CHECK-LABEL: func.func @fp32_residual
// CHECK-SAME: dtype = bf16, residual_dtype = f32
// CHECK: mhc.hyper_connection %{{.*}} {layer = 0 : i64, node = "l0.mlp"} : tensor<2x16xf32>
func.func @fp32_residual(%x: tensor<2x16xf32>) -> tensor<2x16xf32>
    attributes {mhc.config = #mhc.config<vocab = 16, hidden = 8, heads = 2, ffn_hidden = 16,
        seq_len = 2, micro_batch = 1, streams = 2, sinkhorn_iterations = 1,
        gating_factor = 1.0e-02 : f64, norm_eps = 1.0e-06 : f64, dtype = bf16, residual_dtype = f32, seed = 7>} {
  %r = mhc.hyper_connection %x {node = "l0.mlp", layer = 0} : tensor<2x16xf32> {
  ^bb0(%u: tensor<2x8xbf16>):
    %y = mhc.swiglu_mlp %u {node = "mlp"} : tensor<2x8xbf16>
    mhc.yield %y : tensor<2x8xbf16>
  }
  return %r : tensor<2x16xf32>
}

// -----

// A Gated DeltaNet sublayer: the hyper-connection reports it as "gdn".
// CHECK-LABEL: func.func @gdn_sublayer
// CHECK: mhc.hyper_connection %{{.*}}node = "l0.gdn"
// CHECK: mhc.gated_delta_net %{{.*}} {node = "l0.gdn.gdn"} : tensor<4x8xf32>
func.func @gdn_sublayer(%x: tensor<4x16xf32>) -> tensor<4x16xf32> attributes {mhc.config = #mhc.config<vocab = 16,
    hidden = 8, heads = 2, ffn_hidden = 24, seq_len = 4, micro_batch = 1, streams = 2, sinkhorn_iterations = 3,
    gating_factor = 1.0e-02 : f64, norm_eps = 1.0e-06 : f64, dtype = f32, seed = 7>} {
  %g = mhc.hyper_connection %x {node = "l0.gdn", layer = 0} : tensor<4x16xf32> {
  ^bb0(%u: tensor<4x8xf32>):
    %n = mhc.rms_norm %u {node = "l0.gdn.norm", eps = 1.0e-06} : tensor<4x8xf32>
    %y = mhc.gated_delta_net %n {node = "l0.gdn.gdn"} : tensor<4x8xf32>
    mhc.yield %y : tensor<4x8xf32>
  }
  return %g : tensor<4x16xf32>
}

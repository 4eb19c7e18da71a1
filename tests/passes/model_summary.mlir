// RUN: mhc-opt %s --mhc-model-summary -o /dev/null | FileCheck %s

// One layer, C = 8, n = 2, F = 24, V = 16. mHC mapping per sublayer:
// 16*8 + 8 + 3 = 139. Attention 4*64 + 8 = 264, MLP 3*8*24 + 8 = 584,
// embedding + head 2*128 = 256, final norm 8: 2*139 + 264 + 584 + 256 + 8 = 1390.
// CHECK: model one_layer: 1 layers, C = 8, n = 2, heads = 2, FFN = 24, vocab = 16, seq = 4 x 1, f32
// CHECK-NEXT: parameters: 1,390 (0.00 M), of which mHC mappings 278 (20.00%)
// CHECK: pipeline boundary: n*C = 16 values per token (64.0 B), 256.0 B per microbatch of 4 tokens
func.func @one_layer(%tokens: tensor<4xi32>, %labels: tensor<4xi32>) -> tensor<f32>
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
  return %l : tensor<f32>
}

// -----

// A function without #mhc.config is left alone and prints nothing.
// CHECK-NOT: model not_a_model
func.func @not_a_model() {
  return
}

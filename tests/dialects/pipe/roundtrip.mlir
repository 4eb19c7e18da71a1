// RUN: mhc-opt %s --split-input-file | mhc-opt --split-input-file | FileCheck %s
// RUN: mhc-opt %s --split-input-file --mlir-print-op-generic | mhc-opt --split-input-file | FileCheck %s

// CHECK-LABEL: func.func @edges
// CHECK: pipe.boundary %{{.*}} stage 0 -> 1 rank 0 -> 1 : tensor<4x8xf32>
// CHECK: pipe.boundary %{{.*}} stage 1 -> 2 rank 1 -> 0 wraparound : tensor<4x16xf32>
func.func @edges(%x: tensor<4x8xf32>, %r: tensor<4x16xf32>) -> (tensor<4x8xf32>, tensor<4x16xf32>) {
  %a = pipe.boundary %x stage 0 -> 1 rank 0 -> 1 : tensor<4x8xf32>
  %b = pipe.boundary %r stage 1 -> 2 rank 1 -> 0 wraparound : tensor<4x16xf32>
  return %a, %b : tensor<4x8xf32>, tensor<4x16xf32>
}

// -----

// CHECK-LABEL: pipe.schedule "zb-h1" for @m attributes {group_size = 0 : i64, microbatches = 1 : i64, pp = 2 : i64, vpp = 1 : i64}
// CHECK-NEXT: pipe.rank 0 {
// CHECK-NEXT: pipe.forward stage 0 mb 0
// CHECK-NEXT: pipe.send "act" stage 0 -> 1 mb 0 peer 1 group 0 order 0 : tensor<4x16xf32>
// CHECK-NEXT: pipe.free stage 0 mb 0
// CHECK-NEXT: pipe.recv "grad" stage 1 -> 0 mb 0 peer 1 group 1 order 0 : tensor<4x16xf32>
// CHECK-NEXT: pipe.backward_input stage 0 mb 0
// CHECK-NEXT: pipe.backward_weight stage 0 mb 0
// CHECK-NEXT: pipe.optimizer
// CHECK: pipe.rank 1 {
// CHECK: pipe.backward stage 1 mb 0
func.func @m() {
  return
}
pipe.schedule "zb-h1" for @m attributes {group_size = 0, microbatches = 1, pp = 2, vpp = 1} {
  pipe.rank 0 {
    pipe.forward stage 0 mb 0
    pipe.send "act" stage 0 -> 1 mb 0 peer 1 group 0 order 0 : tensor<4x16xf32>
    pipe.free stage 0 mb 0
    pipe.recv "grad" stage 1 -> 0 mb 0 peer 1 group 1 order 0 : tensor<4x16xf32>
    pipe.backward_input stage 0 mb 0
    pipe.backward_weight stage 0 mb 0
    pipe.optimizer
  }
  pipe.rank 1 {
    pipe.recv "act" stage 0 -> 1 mb 0 peer 0 group 0 order 0 : tensor<4x16xf32>
    pipe.forward stage 1 mb 0
    pipe.backward stage 1 mb 0
    pipe.send "grad" stage 1 -> 0 mb 0 peer 0 group 1 order 0 : tensor<4x16xf32>
    pipe.optimizer
  }
}

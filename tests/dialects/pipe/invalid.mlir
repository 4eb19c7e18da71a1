// RUN: mhc-opt %s --split-input-file --verify-diagnostics

func.func @skips_a_stage(%x: tensor<4x8xf32>) {
  // expected-error @+1 {{connects stage 0 to 2; a boundary joins s and s + 1}}
  %a = pipe.boundary %x stage 0 -> 2 rank 0 -> 0 : tensor<4x8xf32>
  return
}

// -----

func.func @not_a_matrix(%x: tensor<4xf32>) {
  // expected-error @+1 {{carries a tensor<T x W>, got 'tensor<4xf32>'}}
  %a = pipe.boundary %x stage 0 -> 1 rank 0 -> 1 : tensor<4xf32>
  return
}

// -----

func.func @m() {
  return
}
// expected-error @+1 {{has 1 ranks but pp = 2}}
pipe.schedule "1f1b" for @m attributes {group_size = 0, microbatches = 1, pp = 2, vpp = 1} {
  pipe.rank 0 {
    pipe.optimizer
  }
}

// -----

func.func @m() {
  return
}
pipe.schedule "1f1b" for @m attributes {group_size = 0, microbatches = 1, pp = 2, vpp = 1} {
  pipe.rank 0 {
    pipe.optimizer
  }
  // expected-error @+1 {{ranks must be listed 0..1 in order; expected rank 1}}
  pipe.rank 0 {
    pipe.optimizer
  }
}

// -----

// expected-error @+1 {{refers to no function @missing}}
pipe.schedule "1f1b" for @missing attributes {group_size = 0, microbatches = 1, pp = 1, vpp = 1} {
  pipe.rank 0 {
    pipe.optimizer
  }
}

// -----

func.func @m() {
  return
}
// expected-error @+1 {{unknown schedule kind 'pipedream'}}
pipe.schedule "pipedream" for @m attributes {group_size = 0, microbatches = 1, pp = 1, vpp = 1} {
  pipe.rank 0 {
    pipe.optimizer
  }
}

// -----

func.func @m() {
  return
}
// expected-error @+1 {{sequence_parallel splits sequences over the tensor-parallel ranks; it needs tp > 1}}
pipe.schedule "1f1b" for @m attributes {group_size = 0, microbatches = 1, pp = 1, vpp = 1, sequence_parallel} {
  pipe.rank 0 {
    pipe.optimizer
  }
}

// -----

func.func @m() {
  return
}
pipe.schedule "1f1b" for @m attributes {group_size = 0, microbatches = 1, pp = 2, vpp = 1} {
  pipe.rank 0 {
    // expected-error @+1 {{an activation goes from stage s to s + 1, got 0 -> 2}}
    pipe.send "act" stage 0 -> 2 mb 0 peer 1 group 0 order 0 : tensor<4x16xf32>
  }
  pipe.rank 1 {
    pipe.optimizer
  }
}

// -----

func.func @m() {
  return
}
pipe.schedule "1f1b" for @m attributes {group_size = 0, microbatches = 1, pp = 2, vpp = 1} {
  pipe.rank 0 {
    // expected-error @+1 {{a gradient goes from stage s to s - 1, got 0 -> 1}}
    pipe.recv "grad" stage 0 -> 1 mb 0 peer 1 group 0 order 0 : tensor<4x16xf32>
  }
  pipe.rank 1 {
    pipe.optimizer
  }
}

// -----

func.func @m() {
  return
}
pipe.schedule "1f1b" for @m attributes {group_size = 0, microbatches = 1, pp = 2, vpp = 1} {
  pipe.rank 0 {
    // expected-error @+1 {{payload must be "act" or "grad", got "weights"}}
    pipe.send "weights" stage 0 -> 1 mb 0 peer 1 group 0 order 0 : tensor<4x16xf32>
  }
  pipe.rank 1 {
    pipe.optimizer
  }
}

// -----

// expected-error @+1 {{expects parent op 'pipe.rank'}}
pipe.forward stage 0 mb 0

//===- Passes.td - mhcc transformation passes --------------*- tablegen -*-===//
//
// Every pass of the mhcc pipeline. Algorithms live in plain C++ beside the
// passes (CostModel, ...) with their own unit tests; passes are thin.
//
//===----------------------------------------------------------------------===//

#ifndef MHCC_PASSES_TD
#define MHCC_PASSES_TD

include "mlir/Pass/PassBase.td"

def MhcModelSummary : Pass<"mhc-model-summary", "mlir::ModuleOp"> {
  let summary = "Print parameters, FLOPs per token and pipeline boundary width";
  let description = [{
    For every model function (a func.func carrying #mhc.config), prints the
    number of transformer layers, trainable parameters (and the share the mHC
    mappings W_map, b and alpha add), forward and training FLOPs per token
    from the cost model, and the width every pipeline boundary inside the
    mHC region carries: n*C values per token, the number a partition must
    budget for. The IR is not changed.

    ```
    model tiny: 4 layers, C = 64, n = 4, heads = 4, FFN = 176, vocab = 256
    ```
  }];
  let dependentDialects = ["::mhcc::mhc::MhcDialect"];
}

def PipePartition : Pass<"pipe-partition", "mlir::ModuleOp"> {
  let summary = "Assign every layer to a virtual pipeline stage";
  let description = [{
    Splits the model into pp * vpp virtual stages (virtual stage
    s = chunk * pp + rank) and records the stage of every top-level mhc op in
    a `pipe.stage` attribute, and the layout on the function (`pipe.layout`,
    `pipe.pp`, `pipe.vpp`).

    With `layout`, the split is the given Megatron-style string (`E`
    embedding, `t` layer, `m` MTP module, `L` loss, `|` between stages, `*N`
    repetition, empty stages allowed). Without it, the partition minimizes
    the slowest stage's forward + backward FLOPs under `memory-cap-gib` per
    stage (weights, gradients and Adam state in fp32, plus p microbatches of
    saved activations) by dynamic programming over the layer chain.
    mhc.expand goes with the first layer, so a cut before it carries C-wide
    tensors; contract, final norm, LM head, loss and MTP go with L.
  }];
  let options = [
    Option<"pp", "pp", "int64_t", "1", "Pipeline ranks p">,
    Option<"vpp", "vpp", "int64_t", "1", "Virtual chunks per rank v">,
    Option<"layout", "layout", "std::string", "\"\"",
           "Megatron-style layout string; empty: cost-balanced automatic partition">,
    Option<"memoryCapGib", "memory-cap-gib", "double", "0",
           "Memory per virtual stage for the automatic partition; 0: no cap">,
    Option<"recomputeSublayers", "recompute-sublayers", "bool", "false",
           "Cost the automatic partition with activation recomputation: a sublayer keeps its input "
           "residual and runs its forward twice">,
    Option<"recomputeNumSublayers", "recompute-num-sublayers", "int64_t", "1",
           "With recompute-sublayers: the sublayers each recomputed segment holds (only its input kept)">,
  ];
  let dependentDialects = ["::mhcc::pipe::PipeDialect"];
}

def PipeInsertP2P : Pass<"pipe-insert-p2p", "mlir::ModuleOp"> {
  let summary = "Insert a pipe.boundary on every edge between virtual stages";
  let description = [{
    For every value produced in stage a and used in stage b > a, inserts one
    pipe.boundary per stage crossed (a -> a+1 -> ... -> b; empty stages
    forward their input), carrying the value's own type: tensor<T x n*C>
    inside the mHC region, tensor<T x C> before mhc.expand. Each boundary
    records its ranks (stage % pp) and whether it is a wraparound edge (the
    last rank's chunk k to rank 0's chunk k + 1). Nothing enters stage 0 and
    nothing leaves the last stage; token ids and labels come from the data
    loader on every rank and never cross. Fails if a value flows backwards.
  }];
}

def PipeSchedule : Pass<"pipe-schedule", "mlir::ModuleOp"> {
  let summary = "Build the static per-rank instruction lists of one step";
  let description = [{
    Builds GPipe, 1F1B, interleaved 1F1B (Megatron's microbatch groups of g,
    warmup (p - r - 1) * 2 + (v - 1) * g, m % g == 0 or >= p) or ZB-H1
    (backward split into input-gradient B and weight-gradient W) lists of
    FWD / BWD / B / W, SEND / RECV with peer, shape, group and FIFO order,
    FREE (pseudo-deallocation of a sent output), with `dp` x `cp` > 1 the
    gradient ALLREDUCE over the rank's data-parallel replicas and
    context-parallel peers, and OPTIM, and writes
    them as a pipe.schedule op. Receives from a peer follow that peer's send order
    by construction.
  }];
  let options = [
    Option<"kind", "kind", "std::string", "\"1f1b\"", "gpipe, 1f1b, interleaved or zb-h1">,
    Option<"microbatches", "microbatches", "int64_t", "1", "Microbatches per step m">,
    Option<"groupSize", "group-size", "int64_t", "0",
           "Interleaved microbatch group g; 0: p">,
    Option<"dp", "dp", "int64_t", "1",
           "Data-parallel replicas running these lists; > 1 ends each rank's backward "
           "with a gradient ALLREDUCE over its replicas">,
    Option<"cp", "cp", "int64_t", "1",
           "Context-parallel ranks sharing each sequence: every boundary carries seq_len / cp "
           "tokens, and the gradient ALLREDUCE spans dp x cp">,
    Option<"tp", "tp", "int64_t", "1",
           "Tensor-parallel ranks splitting each layer's GEMMs; they run the same lists">,
    Option<"sequenceParallel", "sequence-parallel", "bool", "false",
           "Sequence parallelism (tp > 1): every boundary carries seq_len / (cp x tp) tokens">,
    Option<"distributedOptimizer", "distributed-optimizer", "bool", "false",
           "ZeRO-1 (dp > 1): each member of the dp x cp gradient group reduce-scatters the gradients and updates its part">,
    Option<"recomputeSublayers", "recompute-sublayers", "bool", "false",
           "Activation recomputation: recorded on the pipe.schedule; the stages' costs keep each sublayer's "
           "input residual alone and add a second forward to its backward">,
    Option<"recomputeNumSublayers", "recompute-num-sublayers", "int64_t", "1",
           "With recompute-sublayers: the sublayers each recomputed segment holds, recorded on the "
           "pipe.schedule; the costs keep only each segment's input">,
  ];
}

def PipeVerifySchedule : Pass<"pipe-verify-schedule", "mlir::ModuleOp"> {
  let summary = "Simulate all ranks' lists and reject unsafe schedules";
  let description = [{
    Runs every rank's pipe.schedule list together with NCCL's semantics
    (messages of one directed rank pair matched in issue order) and reports,
    on the offending instruction, any deadlock, any send / recv pair whose
    order differs between its two ends (the silent activation / gradient
    swap of p = 2, v = 2), any shape mismatch, any use after FREE, any
    FWD or backward that runs before its input or never, and any gradient
    ALLREDUCE that is missing, repeated, of another size than the rank's
    gradients, or issued before the rank's last backward (every replica of a
    data-parallel group runs the same list, so the group's collectives
    match in order and shape by construction).
  }];
}

def PipeTestMisorderP2P : Pass<"pipe-test-misorder-p2p", "mlir::ModuleOp"> {
  let summary = "Test only: swap two same-peer receives on the last rank";
  let description = [{
    Recreates the hazard the verifier exists for: on the last rank, the
    first two receives from one peer with different payloads (an activation
    and a gradient of equal width) swap what they expect, as a batched
    exchange issued in the wrong order would. -pipe-verify-schedule must
    then reject the schedule.
  }];
}

#endif // MHCC_PASSES_TD

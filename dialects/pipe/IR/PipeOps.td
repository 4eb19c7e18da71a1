//===- PipeOps.td - pipe dialect operations ----------------*- tablegen -*-===//

#ifndef PIPE_OPS_TD
#define PIPE_OPS_TD

include "dialects/pipe/IR/PipeBase.td"
include "mlir/IR/CommonAttrConstraints.td"
include "mlir/IR/SymbolInterfaces.td"
include "mlir/Interfaces/SideEffectInterfaces.td"

def Pipe_NonNegativeI64 : ConfinedAttr<I64Attr, [IntNonNegative]>;
def Pipe_PositiveI64 : ConfinedAttr<I64Attr, [IntMinValue<1>]>;

def Pipe_BoundaryOp : Pipe_Op<"boundary", [Pure, AllTypesMatch<["input", "result"]>]> {
  let summary = "A tensor crossing from virtual stage s to s + 1";
  let description = [{
    The activation goes from `src_stage` (on `src_rank`) to `dst_stage` (on
    `dst_rank`) and, in backward, its gradient of the same shape comes back.
    `wraparound` marks the edge from the last rank's chunk k to rank 0's
    chunk k + 1. An empty stage forwards its input: a value crossing several
    stages passes one boundary per stage.
  }];
  let arguments = (ins
    AnyRankedTensor:$input,
    Pipe_NonNegativeI64:$src_stage, Pipe_NonNegativeI64:$dst_stage,
    Pipe_NonNegativeI64:$src_rank, Pipe_NonNegativeI64:$dst_rank,
    UnitAttr:$wraparound);
  let results = (outs AnyRankedTensor:$result);
  let assemblyFormat = [{
    $input `stage` $src_stage `->` $dst_stage `rank` $src_rank `->` $dst_rank
    (`wraparound` $wraparound^)? attr-dict `:` type($input)
  }];
  let hasVerifier = 1;
  let extraClassDeclaration = [{
    /// Values per token on the wire (n*C or C).
    int64_t getWidth() { return ::llvm::cast<::mlir::RankedTensorType>(getInput().getType()).getDimSize(1); }
  }];
}

def Pipe_ScheduleOp : Pipe_Op<"schedule", [
    NoTerminator, SingleBlock, IsolatedFromAbove,
    DeclareOpInterfaceMethods<SymbolUserOpInterface>]> {
  let summary = "Static per-rank instruction lists for one training step";
  let description = [{
    One `pipe.rank` per pipeline rank, each holding that rank's instructions
    in execution order. `kind` is gpipe, 1f1b, interleaved or zb-h1;
    `group_size` is the interleaved microbatch group g (0 otherwise); `dp`
    (absent: 1) the data-parallel replicas and `cp` (absent: 1) the
    context-parallel ranks of each replica, and `tp` (absent: 1) the
    tensor-parallel ranks of each, that each run these lists: ranks
    ((pipeline rank x dp + replica) x cp + context rank) x tp + tensor rank.
    `sequence_parallel` (tp > 1 only): each tensor-parallel rank holds
    seq_len / tp of every sequence outside the tensor-parallel GEMMs, so
    every boundary carries that share. `distributed_optimizer` (dp x cp > 1
    only): Megatron's distributed optimizer (ZeRO-1) over the gradient group
    (dp x cp): every gradient reduction is a reduce-scatter (`scatter`),
    each member keeping Adam's moments of its part and updating it.
    `recompute_sublayers`: activation recomputation (Megatron's full,
    uniform): each sublayer keeps its input residual from its
    forward to its backward and runs its forward again before it; the
    instructions are the same, the costs and memory are not.
    `recompute_num_sublayers` (with it; absent: 1): the sublayers each
    recomputed segment holds (Megatron's recompute_num_layers), only a
    segment's input kept.
  }];
  let arguments = (ins
    StrAttr:$kind, FlatSymbolRefAttr:$model,
    Pipe_PositiveI64:$pp, Pipe_PositiveI64:$vpp, Pipe_PositiveI64:$microbatches,
    Pipe_NonNegativeI64:$group_size, OptionalAttr<Pipe_PositiveI64>:$dp,
    OptionalAttr<Pipe_PositiveI64>:$cp, OptionalAttr<Pipe_PositiveI64>:$tp,
    UnitAttr:$sequence_parallel, UnitAttr:$distributed_optimizer, UnitAttr:$recompute_sublayers,
    OptionalAttr<Pipe_PositiveI64>:$recompute_num_sublayers);
  let regions = (region SizedRegion<1>:$body);
  let assemblyFormat = "$kind `for` $model attr-dict-with-keyword $body";
  let hasVerifier = 1;
}

def Pipe_RankOp : Pipe_Op<"rank", [NoTerminator, SingleBlock, HasParent<"ScheduleOp">]> {
  let summary = "The instruction list of one pipeline rank";
  let arguments = (ins Pipe_NonNegativeI64:$rank);
  let regions = (region SizedRegion<1>:$body);
  let assemblyFormat = "$rank attr-dict-with-keyword $body";
}

class Pipe_ComputeOp<string mnemonic, string what> : Pipe_Op<mnemonic, [HasParent<"RankOp">]> {
  let summary = what # " of virtual stage `stage` on microbatch `mb`";
  let arguments = (ins Pipe_NonNegativeI64:$stage, Pipe_NonNegativeI64:$mb);
  let assemblyFormat = "`stage` $stage `mb` $mb attr-dict";
}

def Pipe_ForwardOp : Pipe_ComputeOp<"forward", "FWD: the forward">;
def Pipe_BackwardOp : Pipe_ComputeOp<"backward", "BWD: input and weight gradients">;
def Pipe_BackwardInputOp : Pipe_ComputeOp<"backward_input",
    "B: the input gradient (zero-bubble split)">;
def Pipe_BackwardWeightOp : Pipe_ComputeOp<"backward_weight",
    "W: the weight gradient (zero-bubble split)">;

def Pipe_FreeOp : Pipe_ComputeOp<"free",
    "FREE: pseudo-deallocation of the output, once its send has completed">;

def Pipe_AllReduceOp : Pipe_Op<"all_reduce", [HasParent<"RankOp">]> {
  let summary = "ALLREDUCE: sum one stage's gradients over the rank's data-parallel group";
  let description = [{
    A collective of every replica of this pipeline rank (they all run this
    list, so the group issues the same collectives in the same order, with
    the same shapes). One per stage of the rank, a bucket per model chunk:
    `elements` is the number of gradient floats stage `stage` holds; it
    comes after that stage's last backward (W under ZB-H1), so that the
    group sums one chunk while the rank runs the others' backwards, and
    before OPTIM (-pipe-verify-schedule checks all three). `scatter`
    (printed REDUCESCATTER), exactly in a schedule with
    `distributed_optimizer`: each member receives only its part of the sum
    (whole statistics chunks, runtime Artifact::shardOf).
  }];
  let arguments = (ins StrAttr:$group, Pipe_NonNegativeI64:$stage, Pipe_PositiveI64:$elements,
                       UnitAttr:$scatter);
  let assemblyFormat = "$group `stage` $stage $elements `elements` (`scatter` $scatter^)? attr-dict";
  let hasVerifier = 1;
}

def Pipe_CollectiveOp : Pipe_Op<"collective", [HasParent<"RankOp">]> {
  let summary = "COLLECTIVE: one tensor- or context-parallel collective of the compute op before it";
  let description = [{
    A collective of the rank's tensor-parallel group (`axis` "tp") or
    context-parallel group ("cp"): `collective` is all_gather,
    reduce_scatter, all_reduce or all_reduce_max, and `tensor_type` what
    this rank puts in (its rows for an all-gather, the whole tensor
    otherwise). The compute op it follows (of `stage` and `mb`) issues it
    from inside its kernels: its collectives come right after it, in the
    order the kernels issue them (runtime/program/Collectives.h). Every
    rank of the group runs this list; -pipe-verify-schedule checks that
    each compute op lists exactly its stage's collectives, so that no
    member waits in a collective the others never call.
  }];
  let arguments = (ins StrAttr:$axis, StrAttr:$collective, Pipe_NonNegativeI64:$stage,
                       Pipe_NonNegativeI64:$mb, TypeAttrOf<AnyRankedTensor>:$tensor_type);
  let assemblyFormat = [{
    $axis $collective `stage` $stage `mb` $mb `:` $tensor_type attr-dict
  }];
  let hasVerifier = 1;
}

def Pipe_OptimizerOp : Pipe_Op<"optimizer", [HasParent<"RankOp">]> {
  let summary = "OPTIM: apply the accumulated gradients of this rank's stages";
  let assemblyFormat = "attr-dict";
}

class Pipe_CommOp<string mnemonic, string direction> : Pipe_Op<mnemonic, [HasParent<"RankOp">]> {
  let summary = direction # " one boundary tensor";
  let description = [{
    `payload` is "act" (the activation of edge src_stage -> src_stage + 1)
    or "grad" (its gradient, src_stage -> src_stage - 1). Consecutive
    send/recv ops with one `group` are issued together (ncclGroupStart/End);
    `order` is the op's position in this rank's FIFO to or from `peer`.
  }];
  let arguments = (ins
    StrAttr:$payload, Pipe_NonNegativeI64:$src_stage, Pipe_NonNegativeI64:$dst_stage,
    Pipe_NonNegativeI64:$mb, Pipe_NonNegativeI64:$peer, Pipe_NonNegativeI64:$group,
    Pipe_NonNegativeI64:$order, TypeAttrOf<AnyRankedTensor>:$tensor_type);
  let assemblyFormat = [{
    $payload `stage` $src_stage `->` $dst_stage `mb` $mb `peer` $peer `group` $group
    `order` $order `:` $tensor_type attr-dict
  }];
  let hasVerifier = 1;
}

def Pipe_SendOp : Pipe_CommOp<"send", "SEND: sends">;
def Pipe_RecvOp : Pipe_CommOp<"recv", "RECV: receives">;

#endif // PIPE_OPS_TD

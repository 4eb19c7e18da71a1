//===- PipeBase.td - pipe dialect definition ---------------*- tablegen -*-===//
//
// The `pipe` dialect makes pipeline parallelism visible in the IR: which
// virtual stage every layer runs in (the `pipe.stage` attribute), the tensors
// that cross stage boundaries (pipe.boundary, with their n*C or C width), and
// the static per-rank instruction lists a schedule compiles to.
//
//===----------------------------------------------------------------------===//

#ifndef PIPE_BASE_TD
#define PIPE_BASE_TD

include "mlir/IR/OpBase.td"

def Pipe_Dialect : Dialect {
  let name = "pipe";
  let cppNamespace = "::mhcc::pipe";
  let summary = "Pipeline stages, boundary transfers and static schedules";
  let description = [{
    Virtual stage s = chunk * p + rank runs the s-th slice of the model in
    forward order. Every active boundary moves the activation forward and its
    gradient backward with the same shape: tensor<T x n*C> inside the mHC
    region, tensor<T x C> where a cut falls before mhc.expand. The last
    rank's chunk k sends to rank 0's chunk k+1 (wraparound).
  }];
}

class Pipe_Op<string mnemonic, list<Trait> traits = []>
    : Op<Pipe_Dialect, mnemonic, traits>;

#endif // PIPE_BASE_TD

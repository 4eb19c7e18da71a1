//===- MhcBase.td - mhc dialect definition -----------------*- tablegen -*-===//
//
// The `mhc` dialect holds mHC transformer models at the layer level, as
// imported from a model graph (JSON). Every value is a ranked tensor whose
// leading dimension is T, the tokens of one microbatch. The residual stream is
// n streams of width C concatenated on the last axis: tensor<T x (n*C)>.
//
//===----------------------------------------------------------------------===//

#ifndef MHC_BASE_TD
#define MHC_BASE_TD

include "mlir/IR/OpBase.td"
include "mlir/IR/AttrTypeBase.td"

def Mhc_Dialect : Dialect {
  let name = "mhc";
  let cppNamespace = "::mhcc::mhc";
  let summary = "Layer-level ops of manifold-constrained hyper-connection transformers";
  let description = [{
    mHC widens the residual stream of a transformer to n streams (n*C values
    per token) and mixes them with a Sinkhorn-projected doubly stochastic
    matrix around every attention and MLP sublayer. The ops of this dialect
    are the units a pipeline partition cuts between: embedding, expand,
    hyper-connection-wrapped sublayers, contract, final norm, LM head, loss and
    multi-token prediction. Verifiers check every width against n, C, the head
    count, the FFN size and the vocabulary.
  }];
  let useDefaultAttributePrinterParser = 1;
}

class Mhc_Op<string mnemonic, list<Trait> traits = []>
    : Op<Mhc_Dialect, mnemonic, traits>;

class Mhc_Attr<string name, string attrMnemonic, list<Trait> traits = []>
    : AttrDef<Mhc_Dialect, name, traits> {
  let mnemonic = attrMnemonic;
}

#endif // MHC_BASE_TD

#!/usr/bin/env python3
"""Writes models/*.json, the model graphs mhcc ships.

Deliberate regeneration only: `python3 tools/gen_models.py` rewrites every file
under models/. The graphs are a chain: embedding -> mhc_expand -> (attention,
mlp) mhc_sublayer pairs -> mhc_contract -> rmsnorm -> lm_head -> cross_entropy,
with optional MTP modules reading the final residual. A layer count may be
a pattern instead, one letter a layer: A an attention layer, G a Gated
DeltaNet (gdn) layer, each followed by its MLP.
"""
import json
import os

MODELS = {
    # name: (description, config, layers, mtp_depths)
    "tiny": ("Byte-level toy model for CPU tests and the quickstart.",
             dict(vocab=256, hidden=64, heads=4, ffn_hidden=176, seq_len=128,
                  streams=4), 4, [1]),
    "tiny_bf16": ("tiny in bf16: activations stored in bf16, fp32 masters and coefficients (docs/precision.md).",
                  dict(vocab=256, hidden=64, heads=4, ffn_hidden=176, seq_len=128,
                       streams=4, dtype="bf16"), 4, [1]),
    "tiny_bf16_fp32_residual": ("tiny_bf16 with its residual stream in fp32 (Megatron's fp32-residual-connection; "
                                "docs/precision.md).",
                                dict(vocab=256, hidden=64, heads=4, ffn_hidden=176, seq_len=128,
                                     streams=4, dtype="bf16", residual_dtype="f32"), 4, [1]),
    "tiny_n1_bf16_fp32_residual": ("tiny_bf16 as a plain residual model (n = 1) with its residual in fp32: "
                                   "Megatron's fp32-residual-connection (docs/precision.md).",
                                   dict(vocab=256, hidden=64, heads=4, ffn_hidden=176, seq_len=128,
                                        streams=1, dtype="bf16", residual_dtype="f32"), 4, [1]),
    "hybrid_tiny": ("tiny as a hybrid stack: three Gated DeltaNet layers per attention layer, 8 layers.",
                    dict(vocab=256, hidden=64, heads=4, ffn_hidden=176, seq_len=128,
                         streams=4), "GGGAGGGA", [1]),
    "hybrid_1b": ("1b as a hybrid stack at seq 4096 (three Gated DeltaNet layers per attention layer): "
                  "the GDN vs attention throughput benchmark.",
                  dict(vocab=32000, hidden=2048, heads=16, ffn_hidden=5632, seq_len=4096,
                       streams=4, dtype="bf16"), "GGGA" * 4, []),
    "small": ("The shape of Megatron's mHC functional test (C=512, 12 layers).",
              dict(vocab=256, hidden=512, heads=8, ffn_hidden=1408, seq_len=1024,
                   streams=4), 12, []),
    "small_ci": ("small's depth (12 layers, n = 4) shrunk to C=64 and seq 64 for CPU parity tests.",
                 dict(vocab=256, hidden=64, heads=4, ffn_hidden=176, seq_len=64, streams=4),
                 12, [1]),
    "small_bf16": ("small in bf16: flash attention (head dim 64) and cuBLASLt on the GPU.",
                   dict(vocab=256, hidden=512, heads=8, ffn_hidden=1408, seq_len=1024,
                        streams=4, dtype="bf16"), 12, []),
    "small_n1": ("small as a plain residual model (n = 1), for overhead comparisons.",
                 dict(vocab=256, hidden=512, heads=8, ffn_hidden=1408,
                      seq_len=1024, streams=1), 12, []),
    "1b": ("The benchmark model: C=2048, 16 layers, 16 heads, vocab 32000.",
           dict(vocab=32000, hidden=2048, heads=16, ffn_hidden=5632, seq_len=2048,
                streams=4, dtype="bf16"), 16, []),
    "1b_f32": ("1b in fp32: the reference of the bf16 convergence check (docs/precision.md).",
               dict(vocab=32000, hidden=2048, heads=16, ffn_hidden=5632, seq_len=2048,
                    streams=4), 16, []),
    "1b_n1": ("1b as a plain residual model (n = 1).",
              dict(vocab=32000, hidden=2048, heads=16, ffn_hidden=5632,
                   seq_len=2048, streams=1, dtype="bf16"), 16, []),
    "transport_c4096": ("DeepSeek-width transport case: n*C = 16384 on the wire.",
                        dict(vocab=256, hidden=4096, heads=32, ffn_hidden=11008,
                             seq_len=512, streams=4), 4, []),
    "transport_c7168": ("DeepSeek-V3-width transport case: n*C = 28672 on the wire.",
                        dict(vocab=256, hidden=7168, heads=56, ffn_hidden=18432,
                             seq_len=512, streams=4), 4, []),
    "transport_c4096_bf16": ("transport_c4096 in bf16: half the bytes on the wire.",
                             dict(vocab=256, hidden=4096, heads=32, ffn_hidden=11008,
                                  seq_len=512, streams=4, dtype="bf16"), 4, []),
    "transport_c7168_bf16": ("transport_c7168 in bf16: half the bytes on the wire.",
                             dict(vocab=256, hidden=7168, heads=56, ffn_hidden=18432,
                                  seq_len=512, streams=4, dtype="bf16"), 4, []),
}


def graph(name, description, config, layers, mtp_depths):
    nodes = [{"name": "embed", "op": "embedding"},
             {"name": "expand", "op": "mhc_expand", "inputs": ["embed"]}]
    prev = "expand"
    pattern = layers if isinstance(layers, str) else "A" * layers
    for layer, mixer in enumerate(pattern):
        for sub in ({"A": "attention", "G": "gdn"}[mixer], "mlp"):
            node = f"layer{layer}.{ {'attention': 'attn', 'gdn': 'gdn', 'mlp': 'mlp'}[sub] }"
            nodes.append({"name": node, "op": "mhc_sublayer", "inputs": [prev],
                          "attrs": {"sublayer": sub}})
            prev = node
    final_residual = prev
    nodes += [{"name": "contract", "op": "mhc_contract", "inputs": [final_residual]},
              {"name": "final_norm", "op": "rmsnorm", "inputs": ["contract"]},
              {"name": "lm_head", "op": "lm_head", "inputs": ["final_norm"]},
              {"name": "loss", "op": "cross_entropy", "inputs": ["lm_head"]}]
    for depth in mtp_depths:
        nodes.append({"name": f"mtp{depth}", "op": "mtp", "inputs": [final_residual],
                      "attrs": {"depth": depth}})
    return {"format": "mhcc-model-v1", "name": name, "description": description,
            "config": config, "nodes": nodes}


def main():
    out_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "models")
    for name, (description, config, layers, mtp) in MODELS.items():
        path = os.path.join(out_dir, name + ".json")
        with open(path, "w") as f:
            json.dump(graph(name, description, config, layers, mtp), f, indent=1)
            f.write("\n")
        print("wrote", os.path.relpath(path))


if __name__ == "__main__":
    main()

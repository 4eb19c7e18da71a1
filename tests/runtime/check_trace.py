"""Compares a predicted (mhcc --trace) and a measured (mhcrun --trace) timeline.

usage: check_trace.py PREDICTED.json MEASURED.json STEPS
Exits 1 with a message when they do not describe the same instructions;
else prints each timeline's span and bubble, computed alike from its slices.
"""
import collections
import json
import sys


def slices(path):
    events = json.load(open(path))["traceEvents"]
    names = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    return names, [e for e in events if e["ph"] == "X"]


def main(predicted_path, measured_path, steps):
    steps = int(steps)
    tracks, predicted = slices(predicted_path)
    measured_tracks, measured = slices(measured_path)
    if tracks != measured_tracks:
        sys.exit(f"tracks differ: {tracks} vs {measured_tracks}")
    per_rank = collections.defaultdict(list)
    for e in predicted:
        per_rank[e["tid"]].append(e["name"])
    for step in range(1, steps + 1):
        got = collections.defaultdict(list)
        for e in measured:
            if e["args"]["step"] == step:
                got[e["tid"]].append(e["name"])
        for rank, names in per_rank.items():
            if got[rank] != names:
                sys.exit(f"step {step}, rank {rank}: measured {got[rank][:4]}... vs predicted {names[:4]}...")
    for e in predicted + measured:
        if e["dur"] < 0 or e["ts"] < 0:
            sys.exit(f"negative time in {e}")
        if e["cat"] == "optimizer" and e["dur"] <= 0:
            sys.exit(f"an optimizer slice without a duration: {e}")
    for rank in per_rank:
        ends = 0.0
        for e in sorted((e for e in measured if e["tid"] == rank), key=lambda e: e["ts"]):
            # A communication group's instructions share one interval.
            if e["ts"] + 1e-3 < ends and e["cat"] != "comm":
                sys.exit(f"rank {rank}: {e['name']} starts before the previous slice ended")
            ends = max(ends, e["ts"] + e["dur"])
    count = sum(len(v) for v in per_rank.values())
    print(f"{len(per_rank)} ranks, {count} instructions per step: the measured slices of each of {steps} steps "
          f"are the predicted ones")
    ranks = len(per_rank)
    step_ms, bubble = timing(predicted, ranks)
    line = f"predicted: step {step_ms:.3f} ms, bubble {bubble:.4f}; measured:"
    for step in range(1, steps + 1):
        step_ms, bubble = timing([e for e in measured if e["args"]["step"] == step], ranks)
        line += f" step {step} {step_ms:.3f} ms, bubble {bubble:.4f};"
    print(line.rstrip(";") + " (step span, idle / (ranks x span), compute and optimizer slices as busy)")


def timing(events, ranks):
    """The step's span (first slice's start to last slice's end, the
    optimizer's) in ms and its bubble: the time a rank ran neither compute
    nor the optimizer, over ranks x span (the simulator's definition; mhcrun's
    traced-step line, runtime/program/Trace.h, computes the same)."""
    if not events:
        return 0.0, 0.0
    start = min(e["ts"] for e in events)
    span = max(e["ts"] + e["dur"] for e in events) - start
    busy = sum(e["dur"] for e in events if e["cat"] in ("compute", "optimizer"))
    return span / 1e3, (1 - busy / (ranks * span)) if span > 0 else 0.0


if __name__ == "__main__":
    main(*sys.argv[1:])

#!/usr/bin/env python3
"""Turns mhcrun --metrics JSON lines into Megatron's golden-values layout:
{"lm loss": {"start_step": 1, "end_step": N, "step_interval": 1,
 "values": {"1": ..., ...}}, "mtp loss": ..., "num-zeros": ...}
(mhcrun's keys are snake_case: lm_loss, mtp_loss, num_zeros; the golden files
keep Megatron's names.)

Values keep full precision (Python's float repr round-trips), so the golden
test compares exactly."""
import json
import sys


def main():
    rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
    golden = {}
    for metric, key in (("lm loss", "lm_loss"), ("mtp loss", "mtp_loss"), ("num-zeros", "num_zeros")):
        if not all(key in r for r in rows):
            continue
        golden[metric] = {
            "start_step": rows[0]["iteration"],
            "end_step": rows[-1]["iteration"],
            "step_interval": 1,
            "values": {str(r["iteration"]): r[key] for r in rows},
        }
    json.dump(golden, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()

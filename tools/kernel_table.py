#!/usr/bin/env python3
"""Per-kernel time and DRAM traffic of one training step, from Nsight Compute.

usage: kernel_table.py NCU_CSV COPY_GBPS

NCU_CSV is `ncu --csv --metrics gpu__time_duration.sum,dram__bytes_read.sum,
dram__bytes_write.sum` output; COPY_GBPS the device-to-device copy bandwidth
measured in the same run (bytes read + written per second). Prints one row
per kernel name: launches, total and mean time, share of the step, and the
achieved DRAM GB/s against the copy figure (the ceiling of a memory-bound
kernel; compute-bound kernels such as GEMMs and flash attention are judged
in TFLOP/s by gemm_bench and attention_bench instead).
"""
import csv
import sys
from collections import defaultdict

UNITS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0, "nsecond": 1e-9, "usecond": 1e-6, "msecond": 1e-3, "second": 1.0,
         "byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "KB": 1e3, "MB": 1e6, "GB": 1e9}


def main():
    path, copy = sys.argv[1], float(sys.argv[2])
    lines = [l for l in open(path, encoding="utf-8", errors="replace") if l.startswith('"')]
    launches = defaultdict(dict)  # (id, kernel) -> metric -> value in base units
    for row in csv.DictReader(lines):
        value = float(row["Metric Value"].replace(",", ""))
        launches[(row["ID"], row["Kernel Name"])][row["Metric Name"]] = value * UNITS.get(row["Metric Unit"], 1)
    per = defaultdict(lambda: [0, 0.0, 0.0])  # kernel -> launches, seconds, bytes
    for (_, kernel), m in launches.items():
        name = kernel.removeprefix("void ").split("(")[0].strip() or kernel
        for prefix in ("mhcc::runtime::cuda::", "mhcc::", "<unnamed>::", "(anonymous namespace)::"):
            name = name.replace(prefix, "")
        entry = per[name]
        entry[0] += 1
        entry[1] += m.get("gpu__time_duration.sum", 0.0)
        entry[2] += m.get("dram__bytes_read.sum", 0.0) + m.get("dram__bytes_write.sum", 0.0)
    total = sum(e[1] for e in per.values()) or 1.0
    print("%-60s %7s %10s %9s %6s %9s %6s" % ("kernel", "calls", "total ms", "mean us", "share", "GB/s", "%copy"))
    print("%-60s %7d %10.2f %9s %6s %9s %6s" % ("(all kernels of the step)", sum(e[0] for e in per.values()),
                                                 total * 1e3, "", "100%", "", ""))
    for name, (calls, seconds, moved) in sorted(per.items(), key=lambda kv: -kv[1][1]):
        gbps = moved / seconds / 1e9 if seconds else 0.0
        print("%-60s %7d %10.2f %9.1f %5.1f%% %9.0f %5.0f%%" % (name[:60], calls, seconds * 1e3, seconds / calls * 1e6,
                                                               100 * seconds / total, gbps, 100 * gbps / copy))


if __name__ == "__main__":
    main()

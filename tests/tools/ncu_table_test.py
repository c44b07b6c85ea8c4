#!/usr/bin/env python3
"""tools/ncu_table.py against what it must get right: the H200 run's own ncu CSV read launch by
launch (its first NHD and HND launches as bench/results/2026-11-26-h200 states them), and files
made from that run's first launch with the kernel names and durations of bench_transfer's order,
folded by row and kind; a file in another order is refused.

    ncu_table_test.py PROJECT_ROOT
"""
import csv
import gzip
import io
import os
import subprocess
import sys
import tempfile

root = sys.argv[1]
tool = os.path.join(root, "tools", "ncu_table.py")
h200 = os.path.join(root, "bench", "results", "2026-11-26-h200", "verify-run",
                    "ncu_copy_items.csv.gz")


def run(*args, ok=True):
    p = subprocess.run([sys.executable, tool, *args], capture_output=True, text=True)
    if ok and p.returncode != 0:
        sys.exit(f"ncu_table.py {' '.join(args)} failed: {p.stderr}")
    if not ok and p.returncode == 0:
        sys.exit(f"ncu_table.py {' '.join(args)} passed where it must refuse")
    return p.stdout if ok else p.stderr


def cells(out, first):
    for line in out.splitlines():
        parts = [c.strip() for c in line.strip("|").split("|")]
        if parts[0] == first:
            return parts
    sys.exit(f"no line {first!r} in:\n{out}")


# Launch by launch: the H200 run's NHD launch 0 and HND launch 16 (README: 35 µs, 66 % of DRAM,
# 80 registers, 22 % of 37.5 % occupancy, 63 cycles an issue; 56 µs, 45 %, 33 %, 16).
out = run(h200)
assert cells(out, "0")[1:11] == ["copy_items", "256", "80", "35.5", "65.6", "3154", "5.7", "22.6",
                                 "37.5", "62.8"], cells(out, "0")
assert cells(out, "16")[1:4] == ["copy_items", "1056", "80"] and cells(out, "16")[4] == "55.5"
assert cells(out, "16")[10] == "16.3"

# Files in bench_transfer's order, made from the H200 run's launch 0 with each launch's kernel
# name and duration (µs) set.
with gzip.open(h200, "rt", newline="") as f:
    rows = list(csv.reader(line for line in f if line.startswith('"')))
head, first = rows[0], [r for r in rows[1:] if r[0] == "0"]
name_at, metric_at, unit_at, value_at = (head.index(h) for h in
                                         ("Kernel Name", "Metric Name", "Metric Unit",
                                          "Metric Value"))


def make(path, launches):
    buf = io.StringIO()
    w = csv.writer(buf, quoting=csv.QUOTE_ALL, lineterminator="\n")
    w.writerow(head)
    for i, (kernel, us) in enumerate(launches):
        for r in first:
            r = list(r)
            r[0] = str(i)
            r[name_at] = kernel + "(const CopyItem *, unsigned int)"
            if r[metric_at] == "Duration":
                r[unit_at], r[value_at] = "us", f"{us:.2f}"
            w.writerow(r)
    with open(path, "w") as f:
        f.write("a line the benchmark printed\n" + buf.getvalue())


with tempfile.TemporaryDirectory() as d:
    # Copy: two rows of 16 launches, the cycle scatter, gather, scatter ahead, gather ahead; each
    # kind's four launches take 10 + kind + 4 * row + (0, 1, 2, 3) µs: median 11.5 + kind + 4 row.
    copy = os.path.join(d, "copy.csv")
    kinds = ["copy_items", "copy_items", "copy_items_ahead", "copy_items_ahead"]
    make(copy, [(kinds[i % 4], 10 + i % 4 + 4 * (i // 16) + (i % 16) // 4) for i in range(32)])
    out = run(copy, "--bench", "copy")
    assert cells(out, "nhd 16, scatter (4)")[1:5] == ["copy_items", "256", "80", "11.5"], out
    assert cells(out, "nhd 16, gather ahead (4)")[1] == "copy_items_ahead"
    assert cells(out, "nhd 16, gather ahead (4)")[4] == "14.5"
    assert cells(out, "nhd 256, scatter ahead (4)")[4] == "17.5"
    assert len([l for l in out.splitlines() if l.startswith("| nhd")]) == 8
    # Every row bench_transfer prints on a device with VMM (12 of 16 launches): the last is the
    # HND row of head dim 96 and 256-token pages; a launch past it is refused.
    every = os.path.join(d, "every.csv")
    make(every, [(kinds[i % 4], 10 + i // 16) for i in range(192)])
    out = run(every, "--bench", "copy")
    assert cells(out, "hnd 256 dim 96, gather ahead (4)")[1:5] == ["copy_items_ahead", "256",
                                                                   "80", "21.0"], out
    assert cells(out, "hnd 16 dim 80, scatter (4)")[4] == "18.0"
    make(every, [(kinds[i % 4], 10) for i in range(193)])
    assert "launch 192 is past" in run(every, "--bench", "copy", ok=False)
    # Decode: one row of 10 launches and one launch of the next, spread and ahead alternating.
    dec = os.path.join(d, "decode.csv")
    make(dec, [("decode_items" if i % 2 == 0 else "decode_items_ahead", 20 + i) for i in range(11)])
    out = run(dec, "--bench", "decode")
    assert cells(out, "kivi-8 g32, nhd 16, spread (5)")[4] == "24.0", out
    assert cells(out, "kivi-8 g32, nhd 16, ahead (5)")[4] == "25.0"
    assert cells(out, "kivi-8 g32, nhd 256, spread (1)")[4] == "30.0"
    # Every decode row (16 of 10 launches): the last is fp8 into HND pages at head dim 96.
    make(dec, [("decode_items" if i % 2 == 0 else "decode_items_ahead", 20 + i // 10)
               for i in range(160)])
    out = run(dec, "--bench", "decode")
    assert cells(out, "fp8 e4m3, hnd 16 dim 96, ahead (5)")[1:5] == [
        "decode_items_ahead", "256", "80", "35.0"], out
    assert cells(out, "kivi-4 g32, hnd 16 dim 80, spread (5)")[4] == "32.0"
    # Another order is refused, naming the launch: the decode file read as copy rows, and the
    # H200 run's file (before the ahead launch).
    assert "launch 0 is decode_items" in run(dec, "--bench", "copy", ok=False)
    assert "launch 2 is copy_items, where" in run(h200, "--bench", "copy", ok=False)
    # Not an ncu CSV, and a bad option.
    assert "no ncu CSV header" in run(os.path.join(root, "README.md"), ok=False)
    assert "usage" in run(copy, "--bench", "attention", ok=False)
print("ncu_table.py: every check passed")

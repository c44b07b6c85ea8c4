#!/usr/bin/env python3
"""A Markdown table of Nsight Compute's figures for the transfer kernels' launches, from what
`ncu --csv` prints (tools/device-profile.sh keeps it as ncu_decode.csv.gz and ncu_copy.csv.gz).

    ncu_table.py NCU.csv[.gz] [--bench decode|copy]

Without --bench, one line per launch. With it, the launches are named by the rows of
`bench_transfer --kernels --reps 1`, in the order that program launches them (measure_kernel,
measure_decode; kernel_tables gives the rows' order), and each row's launches of one kind are
folded into one line (medians); a launch whose kernel is not the one that order expects stops
the table, so a change of that order cannot name launches wrongly. The columns say where a launch
stands: DRAM and SM throughput against the device's peak, occupancy achieved against what the
registers allow, cycles between a warp's issued instructions, and the share of cycles in which a
scheduler had a warp ready to issue.
"""
import csv
import gzip
import statistics
import sys

# (section, metric) -> column, and the scale that brings the metric's unit to the column's.
COLUMNS = [
    ("grid", ("Launch Statistics", "Grid Size")),
    ("regs", ("Launch Statistics", "Registers Per Thread")),
    ("µs", ("GPU Speed Of Light Throughput", "Duration")),
    ("DRAM %", ("GPU Speed Of Light Throughput", "DRAM Throughput")),
    ("GB/s", ("Memory Workload Analysis", "Memory Throughput")),
    ("SM %", ("GPU Speed Of Light Throughput", "Compute (SM) Throughput")),
    ("occupancy %", ("Occupancy", "Achieved Occupancy")),
    ("of", ("Occupancy", "Theoretical Occupancy")),
    ("cycles / issue", ("Warp State Statistics", "Warp Cycles Per Issued Instruction")),
    ("ready %", ("Scheduler Statistics", "One or More Eligible")),
]
TIME_TO_US = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3,
              "s": 1e6, "second": 1e6}
RATE_TO_GBS = {"byte/s": 1e-9, "Kbyte/s": 1e-6, "Mbyte/s": 1e-3, "Gbyte/s": 1.0,
               "Tbyte/s": 1e3}

# bench_transfer --kernels --reps 1: the rows in kernel_tables' order, and each row's launches of
# its kernels in measure_kernel's / measure_decode's order (three warm-ups and one repetition of
# the cycle; measure_decode then launches each kind once more for its exactness check). The copy
# rows past "hnd 256" are named as on a device with VMM (bench_transfer leaves the vmm rows out
# where it has none); device-profile.sh profiles only the four before them by default
# (COPY_LAUNCHES=192 takes every row, the HND rows of head dims 80 and 96 last); of the decode
# rows, the first 12 (DECODE_LAUNCHES=160 adds the four HND rows of head dims 80 and 96).
CODECS = ["kivi-8 g32", "kivi-4 g32", "kivi-2 g32", "fp8 e4m3"]
BENCHES = {
    "copy": {
        "rows": ["nhd 16", "nhd 256", "hnd 16", "hnd 256", "nhd 16 vmm", "nhd 256 vmm",
                 "nhd 16 layer_of_8", "nhd 256 layer_of_8", "hnd 16 dim 80", "hnd 256 dim 80",
                 "hnd 16 dim 96", "hnd 256 dim 96"],
        "cycle": [("scatter", "copy_items"), ("gather", "copy_items"),
                  ("scatter ahead", "copy_items_ahead"), ("gather ahead", "copy_items_ahead")],
        "per_row": 16,
    },
    "decode": {
        "rows": [f"{c}, nhd {p}" for c in CODECS for p in (16, 256)] +
                [f"{c}, hnd 16" for c in CODECS] +
                [f"{c}, hnd 16 dim {d}" for d in (80, 96) for c in (CODECS[1], CODECS[3])],
        "cycle": [("spread", "decode_items"), ("ahead", "decode_items_ahead")],
        "per_row": 10,
    },
}


def number(text):
    text = text.strip().replace(",", "")
    try:
        return float(text)
    except ValueError:
        return None  # "no data", "n/a", ""


def read_launches(path):
    """Launches in the order profiled: (kernel name, {column: value})."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", newline="") as f:
        lines = [line for line in f if line.startswith('"')]  # the program's own lines are not
    rows = list(csv.reader(lines))
    if not rows or rows[0][:1] != ["ID"]:
        sys.exit(f"ncu_table.py: no ncu CSV header in {path}")
    head = rows[0]
    col = {name: head.index(name) for name in
           ("ID", "Kernel Name", "Section Name", "Metric Name", "Metric Unit", "Metric Value")}
    wanted = {key: name for name, key in COLUMNS}
    launches, order = {}, []
    need = max(col.values()) + 1  # metric lines lack the rule columns
    for r in rows[1:]:
        if len(r) < need:
            continue
        lid = r[col["ID"]]
        if lid not in launches:
            launches[lid] = (r[col["Kernel Name"]].split("(")[0].strip(), {})
            order.append(lid)
        name = wanted.get((r[col["Section Name"]], r[col["Metric Name"]]))
        if name is None:
            continue
        value, unit = number(r[col["Metric Value"]]), r[col["Metric Unit"]].strip()
        if value is not None and name == "µs":
            if unit not in TIME_TO_US:
                sys.exit(f"ncu_table.py: a duration in {unit!r}")
            value *= TIME_TO_US[unit]
        elif value is not None and name == "GB/s":
            if unit not in RATE_TO_GBS:
                sys.exit(f"ncu_table.py: a memory throughput in {unit!r}")
            value *= RATE_TO_GBS[unit]
        launches[lid][1][name] = value
    if not order:
        sys.exit(f"ncu_table.py: no launches in {path}")
    return [launches[lid] for lid in order]


def cell(name, value):
    if value is None:
        return "-"
    if name in ("grid", "regs"):
        return f"{value:.0f}"
    return f"{value:.1f}" if value < 100 or name.endswith("%") else f"{value:.0f}"


def table(first, lines):
    names = [name for name, _ in COLUMNS]
    out = ["| " + " | ".join([first, "kernel"] + names) + " |",
           "|" + " --- |" * (len(names) + 2)]
    for label, kernel, values in lines:
        out.append("| " + " | ".join([label, kernel] + [cell(n, values.get(n)) for n in names]) +
                   " |")
    return "\n".join(out)


def by_bench(launches, bench):
    spec = BENCHES[bench]
    cycle, per_row = spec["cycle"], spec["per_row"]
    groups = {}
    for i, (kernel, values) in enumerate(launches):
        row = i // per_row
        if row >= len(spec["rows"]):
            sys.exit(f"ncu_table.py: launch {i} is past bench_transfer's {bench} rows")
        kind, expected = cycle[i % len(cycle)]
        if kernel != expected:
            sys.exit(f"ncu_table.py: launch {i} is {kernel}, where bench_transfer's {bench} "
                     f"rows launch {expected} ({spec['rows'][row]}, {kind}): not that order")
        groups.setdefault((row, kind), (kernel, []))[1].append(values)
    lines = []
    for (row, kind), (kernel, runs) in groups.items():
        folded = {}
        for name, _ in COLUMNS:
            got = [v[name] for v in runs if v.get(name) is not None]
            folded[name] = statistics.median(got) if got else None
        lines.append((f"{spec['rows'][row]}, {kind} ({len(runs)})", kernel, folded))
    return lines


def main(argv):
    if len(argv) not in (2, 4) or (len(argv) == 4 and (argv[2] != "--bench" or
                                                        argv[3] not in BENCHES)):
        sys.exit("usage: ncu_table.py NCU.csv[.gz] [--bench decode|copy]")
    launches = read_launches(argv[1])
    if len(argv) == 4:
        print(table("row, launch (launches)", by_bench(launches, argv[3])))
    else:
        print(table("launch", [(str(i), k, v) for i, (k, v) in enumerate(launches)]))


if __name__ == "__main__":
    main(sys.argv)

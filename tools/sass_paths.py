#!/usr/bin/env python3
"""The instruction counts of a kernel's inner loops, from nvdisasm's output (-c).

For each loop that holds a 16-byte store to global memory (STG, or ST through a generic address
as the copy kernel's are: the decode kernel's inner loops, the copy kernel's loop over items)
and ends in a branch back to its head: its body's size, and the length of every path through
one iteration, each conditional branch taken both ways (so paths the data never takes are
listed too; a loop made for one codec has only its own). Predicated instructions count as
issued; a call counts as one (what it runs is not followed).

    sass_paths.py FILE.sass KERNEL_NAME_PART
"""
import re
import sys

BRANCH = re.compile(r"BRA `\((\.L_x_\d+)\)")
GUARD = re.compile(r"@!?U?P\d")
# A 16-byte store to global memory, by a global (STG) or a generic (ST) address; loads likewise.
STORE16 = re.compile(r"\bSTG?\.E\.128\b")
LOAD = re.compile(r"\bLDG?\.E\b")


def kernel_lines(text, name):
    lines = text.split("\n")
    starts = [i for i, l in enumerate(lines) if l.startswith(".text.") and name in l]
    if not starts:
        sys.exit(f"sass_paths.py: no kernel whose name holds {name!r}")
    end = next((i for i in range(starts[0] + 1, len(lines)) if lines[i].startswith(".text.")),
               len(lines))
    instructions, labels = [], {}
    for line in lines[starts[0]:end]:
        m = re.match(r"^(\.L_x_\d+):", line)
        if m:
            labels[m.group(1)] = len(instructions)
        elif re.match(r"\s*/\*[0-9a-f]+\*/", line):
            instructions.append(line)
    return instructions, labels


def path_lengths(ins, labels, head, back):
    """Lengths of the paths from head to the back edge at `back`, at most 64 of them."""
    lengths = set()

    def walk(pc, n, depth):
        while depth <= 40 and len(lengths) <= 64:
            if pc == back:
                lengths.add(n + 1)
                return
            if pc > back or pc < head:
                return
            line = ins[pc]
            n += 1
            m = BRANCH.search(line)
            if m:
                target = labels[m.group(1)]
                if GUARD.search(line):
                    walk(pc + 1, n, depth + 1)
                if target <= pc:  # an inner loop's back edge
                    return
                pc = target
                continue
            if "EXIT" in line and not GUARD.search(line):
                return
            pc += 1

    walk(head, 0, 0)
    return sorted(lengths)


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    ins, labels = kernel_lines(open(sys.argv[1]).read(), sys.argv[2])
    seen = set()
    for i, line in enumerate(ins):
        if not STORE16.search(line):
            continue
        for j in range(i, min(i + 8, len(ins))):
            m = BRANCH.search(ins[j])
            if m and labels.get(m.group(1), len(ins)) < i:
                head = labels[m.group(1)]
                if head not in seen:
                    seen.add(head)
                    loads = sum(bool(LOAD.search(x)) for x in ins[head:j + 1])
                    print(f"loop at {head}: body {j - head + 1}, loads {loads}, "
                          f"paths {path_lengths(ins, labels, head, j)}")
                break


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Compare the machine code of the kernels in two sets of CUDA objects, kernel by kernel.

    python scripts/compare_sass.py --before old/*.o --after new/*.o

Runs `cuobjdump -sass` (and nvdisasm, which it calls: both on PATH) on every object, splits the listing by
function and compares each kernel's instructions and their encodings. Names are compared with the
anonymous-namespace tag, which nvcc derives from the file name, removed, so a kernel moved to another file
is matched with itself. Prints one line a kernel (same / DIFFERENT / only before / only after) and exits 1
when any kernel differs or is missing on one side.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys

ANON = re.compile(r"\d+_GLOBAL__N__[0-9a-f]+_\d+_\w+?_[0-9a-f]{8}")  # _GLOBAL__N__<hash>_<n>_<file>_<hash>
ADDR = re.compile(r"/\*[0-9a-f]{4,}\*/")


def kernels(obj: str) -> dict[str, list[str]]:
    """Kernel name (anonymous namespace tag removed) -> its instructions, addresses stripped."""
    text = subprocess.run(["cuobjdump", "-sass", obj], capture_output=True, text=True, check=True).stdout
    out: dict[str, list[str]] = {}
    name = None
    for line in text.splitlines():
        if "Function :" in line:
            name = ANON.sub("ANON", line.split("Function :", 1)[1].strip())
            out[name] = []
        elif name and "/* 0x" in line:  # an instruction, or the second half of its encoding
            out[name].append(" ".join(ANON.sub("ANON", ADDR.sub("", line)).split()))
        elif name and line.strip() and not line.lstrip().startswith("."):
            name = None
    for code in out.values():  # the NOPs that pad a function to its alignment (and their encodings)
        while len(code) >= 2 and code[-2].startswith("NOP"):
            del code[-2:]
    return out


def collect(objs: list[str]) -> dict[str, list[str]]:
    merged: dict[str, list[str]] = {}
    for obj in objs:
        for name, code in kernels(obj).items():
            if name in merged and merged[name] != code:
                sys.exit(f"{name}: two different definitions among {objs}")
            merged[name] = code
    return merged


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", nargs="+", required=True)
    ap.add_argument("--after", nargs="+", required=True)
    args = ap.parse_args()
    before, after = collect(args.before), collect(args.after)
    bad = 0
    for name in sorted(before.keys() | after.keys()):
        if name not in after:
            status, bad = "only before", bad + 1
        elif name not in before:
            status, bad = "only after", bad + 1
        elif before[name] == after[name]:
            status = f"same ({sum(1 for x in before[name] if not x.startswith('/*'))} instructions)"
        else:
            status, bad = "DIFFERENT", bad + 1
        print(f"{status:28s} {name}")
    print(f"{len(before)} kernels before, {len(after)} after, {bad} differing or missing")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

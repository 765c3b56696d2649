"""Where decode time goes, per kernel, under Nsight Compute (run on the device machine, PYTHONPATH=.).

  profile_decode.py <build dir>     (profile_decode.sh builds with -lineinfo and calls this)

Clocks are left alone (--clock-control none). Each profiled kernel runs alone with cold caches, so its
duration is an upper bound of its share of a real (PDL-overlapped) decode step; the point is the split.
  1. `ar`: one 520-token prompt + 4 decode steps, light metrics on every kernel (duration, DRAM bytes,
     grid, registers); the last decode step's kernels are summarised by kind and layer.
  2. `ar`: the full section set (speed of light, memory, warp states) on one DeltaNet layer, one attention
     layer and the LM head of that last step.
  3. megakernel: the full set plus source-level stall sampling on one decode launch.
Writes $OUT/profile.json (the summaries), $OUT/ar_details.txt, $OUT/ar_source_lines.txt (warp stalls per
CUDA source line of 8 kernels), $OUT/mk_details.txt, $OUT/mk_source_lines.txt.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

OUT = Path(os.environ.get("OUT", "/tmp/out"))
CKPT = Path("/tmp/qwen35-0.8b-synth")
NCU = shutil.which("ncu") or "/usr/local/cuda/bin/ncu"
LIGHT = ["gpu__time_duration.sum", "dram__bytes_read.sum", "dram__bytes_write.sum", "launch__grid_size",
         "launch__block_size", "launch__registers_per_thread", "sm__warps_active.avg.pct_of_peak_sustained_active",
         "dram__throughput.avg.pct_of_peak_sustained_elapsed"]
T0 = time.time()
summary: dict = {}


def log(msg: str) -> None:
    print(f"[{time.time() - T0:6.1f}s] {msg}", flush=True)


def requests(prompt: list[int], n_gen: int) -> Path:
    req = Path("/tmp/pf_req.jsonl")
    req.write_text(json.dumps({"type": "generate", "id": "p", "prompt_ids": prompt, "n_gen": n_gen}) + "\n"
                   + '{"type": "shutdown"}\n')
    return req


def ncu(exe: Path, args: list[str], req: Path, timeout: int = 400, ckpt: Path = CKPT) -> None:
    cmd = [NCU, "--clock-control", "none", *args, str(exe), "--model", str(ckpt), "--max-ctx", "1024"]
    log(" ".join(cmd[:12]) + " ...")
    with open(req) as fin:
        r = subprocess.run(cmd, stdin=fin, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=timeout, text=True)
    if r.returncode != 0:
        log(f"ncu exit {r.returncode}: {r.stderr[-2000:]}")


def short(name: str) -> str:
    """The kernel's own name (with template arguments): every kernel of the engines ends in `_kernel`."""
    m = re.search(r"(\w+_kernel\w*(?:<[^>]*>)?)", name)
    return m.group(1) if m else name[:80]


def num(v: str) -> float:
    try:
        return float(v.replace(",", ""))
    except (ValueError, AttributeError):
        return float("nan")


def ar_light(exe: Path, p520: list[int], ckpt: Path = CKPT) -> list[dict]:
    """One row per kernel launch of a 520-token prefill and 4 decode steps, in launch order (ncu's CSV log
    has one line per kernel and metric; the log stays in /tmp/pf_ar_light.csv)."""
    logf = Path("/tmp/pf_ar_light.csv")
    ncu(exe, ["--metrics", ",".join(LIGHT), "--csv", "--print-units", "base", "--log-file", str(logf)],
        requests(p520, 4), ckpt=ckpt)
    lines = [ln for ln in logf.read_text().splitlines() if ln.startswith('"')]
    by_id: dict[int, dict] = {}
    for r in csv.DictReader(io.StringIO("\n".join(lines))):
        if not r.get("ID", "").strip().isdigit():
            continue
        k = by_id.setdefault(int(r["ID"]), {"id": int(r["ID"]), "name": short(r.get("Kernel Name", "?"))})
        k[r["Metric Name"]] = r["Metric Value"]
    log(f"{len(by_id)} kernels profiled; first: {[k['name'] for k in list(by_id.values())[:3]]}")
    return [{"id": k["id"], "name": k["name"], "us": num(k.get("gpu__time_duration.sum", "nan")) / 1e3,
             "dram_rd_MB": num(k.get("dram__bytes_read.sum", "nan")) / 1e6,
             "dram_wr_MB": num(k.get("dram__bytes_write.sum", "nan")) / 1e6,
             "grid": k.get("launch__grid_size"), "block": k.get("launch__block_size"),
             "regs": k.get("launch__registers_per_thread"),
             "occ_pct": num(k.get("sm__warps_active.avg.pct_of_peak_sustained_active", "nan")),
             "dram_pct": num(k.get("dram__throughput.avg.pct_of_peak_sustained_elapsed", "nan"))}
            for _, k in sorted(by_id.items())]


def by_kernel(ks: list[dict]) -> list[list]:
    """Launches grouped by kernel and launch shape, most time first: [kernel, count, us total, us each,
    DRAM MB each, TB/s, warps active %] (BY_KERNEL_COLUMNS)."""
    agg: dict = {}
    for k in ks:
        key = f"{k['name']} grid={k['grid']} block={k['block']} regs={k['regs']}"
        a = agg.setdefault(key, {"n": 0, "us": 0.0, "MB": 0.0, "occ": 0.0})
        a["n"] += 1
        a["us"] += k["us"]
        a["MB"] += k["dram_rd_MB"] + k["dram_wr_MB"]
        a["occ"] += k["occ_pct"]
    return sorted(([key, a["n"], round(a["us"], 1), round(a["us"] / a["n"], 2), round(a["MB"] / a["n"], 2),
                    round(a["MB"] / a["us"], 2), round(a["occ"] / a["n"], 1)] for key, a in agg.items()),
                  key=lambda x: -x[2])


BY_KERNEL_COLUMNS = ["kernel", "count", "us total", "us each", "DRAM MB each", "TB/s", "warps active %"]


def decode_step_start(ks: list[dict]) -> int | None:
    """Index of the last decode step's first kernel (the decode graph starts with embed_decode_kernel)."""
    starts = [i for i, k in enumerate(ks) if k["name"].startswith("embed_decode")]
    return starts[-1] if starts else None


def describe_step(ks: list[dict]) -> dict:
    first = decode_step_start(ks)
    if first is None:
        return {"error": "no embed_decode kernel"}
    step = ks[first:]
    return {"first_index": first, "n_kernels": len(step), "us_total": round(sum(k["us"] for k in step), 1),
            "dram_MB_total": round(sum(k["dram_rd_MB"] + k["dram_wr_MB"] for k in step), 1),
            "by_kernel": by_kernel(step), "by_kernel_columns": BY_KERNEL_COLUMNS,
            "sequence": [[k["name"], round(k["us"], 2), round(k["dram_rd_MB"] + k["dram_wr_MB"], 2), k["grid"]]
                         for k in step]}


def details(rep: Path, dest: Path, append: str = "") -> None:
    """ncu's details page of a report into dest (appended under the heading `append` when given)."""
    txt = subprocess.run([NCU, "--import", str(rep), "--page", "details", "--print-units", "base",
                          "--print-details", "all"], capture_output=True, text=True, timeout=300)
    body = txt.stdout + ("\n--- stderr\n" + txt.stderr if txt.stderr else "")
    if append:
        with open(dest, "a") as f:
            f.write(f"\n\n===== {append}\n" + body)
    else:
        dest.write_text(body)


def tool(name: str) -> str:
    return shutil.which(name) or f"/usr/local/cuda/bin/{name}"


def demangled_short(mangled: str) -> str:
    """short() of an Itanium-mangled kernel name: its identifier and integer template arguments."""
    m = re.search(r"(\d+)([A-Za-z_]\w*)", mangled)
    while m:
        n = int(m.group(1))
        ident = m.group(2)[:n]
        rest = mangled[m.start(2) + n:]
        if re.search(r"_kernel\w*$", ident) and not ident.startswith("_GLOBAL__N"):  # not an anonymous namespace
            # (nvcc names those after the file: _GLOBAL__N__<hash>_16_decode_kernel_cu_<hash>)
            args = re.match(r"I((?:Li-?\d+E)+)E", rest)
            if args:
                return ident + "<" + ", ".join(re.findall(r"Li(-?\d+)E", args.group(1))) + ">"
            return ident
        m = re.search(r"(\d+)([A-Za-z_]\w*)", rest)
        mangled = rest
    return mangled


def sass_lines(build: Path) -> dict[str, dict[int, tuple[str, int]]]:
    """kernel short name -> {SASS offset: (source file, line)} from the build's own cubins (-lineinfo)."""
    objs = list(build.rglob("*.cu.o"))
    tmp = Path("/tmp/pf_cubins")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    out: dict[str, dict[int, tuple[str, int]]] = {}
    for o in objs:
        subprocess.run([tool("cuobjdump"), "-xelf", "all", str(o.resolve())], cwd=tmp, capture_output=True, timeout=120)
    for cub in tmp.glob("*.cubin"):
        txt = subprocess.run([tool("nvdisasm"), "-g", "-c", str(cub)], capture_output=True, text=True, timeout=300).stdout
        fun, loc = None, ("?", 0)
        for ln in txt.splitlines():
            m = re.match(r"\s*(?:\.text\.)?(_Z\w+):\s*$", ln)
            if m:
                fun = demangled_short(m.group(1))
                out.setdefault(fun, {})
                continue
            m = re.search(r'//## File "([^"]+)", line (\d+)', ln)
            if m:
                loc = (Path(m.group(1)).name, int(m.group(2)))
                continue
            m = re.match(r"\s*/\*([0-9a-f]{4,})\*/", ln)
            if m and fun:
                out[fun][int(m.group(1), 16)] = loc
    return out


def stall_by_line(exe: Path, launch: int, req: Path, lines: dict[str, dict[int, tuple[str, int]]]) -> str:
    """Warp-stall samples of one kernel launch (the launch-th of the run), summed per CUDA source line."""
    rep = Path("/tmp/pf_src")
    ncu(exe, ["--section", "SourceCounters", "--section", "WarpStateStats", "--launch-skip", str(launch),
              "--launch-count", "1", "-f", "-o", str(rep)], req)
    return source_lines(rep.with_suffix(".ncu-rep"), lines, f"launch {launch}")


def source_lines(rep: Path, lines: dict[str, dict[int, tuple[str, int]]], label: str, top: int = 25) -> str:
    """The `top` CUDA source lines of the report's (one) kernel with the most warp-stall samples, their share
    and their three main stall reasons; SASS offsets are mapped to lines with the build's own line tables."""
    r = subprocess.run([NCU, "--import", str(rep), "--page", "source", "--csv", "--print-source", "sass"],
                       capture_output=True, text=True, timeout=300)
    out_lines = r.stdout.splitlines()
    hdr = next((i for i, ln in enumerate(out_lines) if ln.startswith('"Address"')), None)
    rows = list(csv.DictReader(io.StringIO("\n".join(out_lines[hdr:])))) if hdr is not None else []
    rows = [x for x in rows if x.get("Address", "").startswith("0x")]
    if not rows:
        return f"no source rows: {r.stderr[-300:]} | " + " / ".join(out_lines[:6])[:1500]
    d = subprocess.run([NCU, "--import", str(rep), "--page", "details", "--print-units", "base", "--section",
                        "SourceCounters"], capture_output=True, text=True, timeout=300).stdout
    kname = next((short(ln) for ln in d.splitlines() if "_kernel" in ln), "?")
    base = min(int(x["Address"], 16) for x in rows)
    table = lines.get(kname, {})
    per: dict[tuple[str, int | str], dict] = {}
    total = 0.0
    for x in rows:
        n = num(x.get("Warp Stall Sampling (All Samples)", "0"))
        if n != n or n == 0:
            continue
        total += n
        off = int(x["Address"], 16) - base
        # without a line table for the kernel (its cubin not found), the SASS instruction itself
        loc = table.get(off, ("?", 0)) if table else ("sass+" + hex(off), x.get("Source", "").strip())
        e = per.setdefault(loc, {"samples": 0.0, "why": {}})
        e["samples"] += n
        for c, v in x.items():
            if c.startswith("stall_") and "Not Issued" not in c and num(v) == num(v):
                e["why"][c[6:]] = e["why"].get(c[6:], 0) + num(v)
    text = {f.name: f.read_text().splitlines() for f in Path("engines").rglob("*") if f.suffix in (".cu", ".cuh", ".h")}
    outl = [f"== {kname} ({label}), {total:.0f} samples, {len(table)} SASS offsets mapped"]
    for (f, ln), e in sorted(per.items(), key=lambda kv: -kv[1]["samples"])[:top]:
        why = ", ".join(f"{k} {v:.0f}" for k, v in sorted(e["why"].items(), key=lambda kv: -kv[1])[:3])
        if isinstance(ln, str):  # a SASS instruction
            outl.append(f"{100 * e['samples'] / total:5.1f}%  {f}  [{why}]  {ln[:110]}")
            continue
        code = text.get(f, [""] * (ln + 1))[ln - 1].strip() if ln > 0 else ""
        outl.append(f"{100 * e['samples'] / total:5.1f}%  {f}:{ln}  [{why}]  {code[:110]}")
    return "\n".join(outl)


def main() -> None:
    build = Path(sys.argv[1])
    ar = build / "lucebench-ar"
    mk = build / "lucebench-megakernel"
    import torch

    p520 = torch.randint(0, 248320, (520,), generator=torch.Generator().manual_seed(1)).tolist()

    ks = ar_light(ar, p520)
    step = describe_step(ks)
    summary["ar_decode_step_after_520"] = step
    (OUT / "profile.json").write_text(json.dumps(summary, indent=1))
    log(f"ar decode step: {step.get('n_kernels')} kernels, {step.get('us_total')} us, {step.get('dram_MB_total')} MB")
    for row in step.get("by_kernel", []):
        log(f"  {row}")

    # 2. full sets on the last step's kernels: embed, layers 0..3 (3 DeltaNet + 1 attention), and the LM head
    if "first_index" in step:
        first = step["first_index"]
        seq = step["sequence"]
        n_head = len(seq) - 2  # the step ends with the LM head (GEMV + argmax) and decode_finish
        rep = Path("/tmp/pf_ar_full")
        if os.environ.get("PF_FULL", "1") != "0":
            ncu(ar, ["--set", "full", "--launch-skip", str(first), "--launch-count", "18", "-f", "-o", str(rep)],
                requests(p520, 4))
            details(rep.with_suffix(".ncu-rep"), OUT / "ar_details.txt")
            rep2 = Path("/tmp/pf_ar_head")
            ncu(ar, ["--set", "full", "--launch-skip", str(first + n_head), "--launch-count", "1", "-f", "-o",
                     str(rep2)], requests(p520, 4))
            details(rep2.with_suffix(".ncu-rep"), OUT / "ar_details.txt", append="LM head")
            log("ar full-set details written")
        # source lines: layer 1 (DeltaNet: in-projection, delta rule, gated out-projection, MLP), layer 3
        # (attention: qkv, prep, attention, o-projection)
        table = sass_lines(build)
        log(f"SASS line tables for {len(table)} kernels")
        picks = [int(x) for x in os.environ.get("PF_PICKS", "5,6,7,8,13,14,15,16").split(",")]
        with open(OUT / "ar_source_lines.txt", "w") as f:
            for i in picks:
                f.write(stall_by_line(ar, first + i, requests(p520, 4), table) + "\n\n")
        log("ar source-line stalls written")

    # 3. megakernel: one decode launch (the 3rd decode_kernel launch: after warm-up), full set + source
    if mk.exists() and os.environ.get("PF_MK", "1") != "0":
        rep = Path("/tmp/pf_mk")
        ncu(mk, ["--set", "full", "--import-source", "yes", "-k", "regex:^decode_kernel", "--launch-skip", "2",
                 "--launch-count", "1", "-f", "-o", str(rep)], requests(p520, 4))
        details(rep.with_suffix(".ncu-rep"), OUT / "mk_details.txt")
        (OUT / "mk_source_lines.txt").write_text(source_lines(rep.with_suffix(".ncu-rep"), sass_lines(build),
                                                              "3rd decode launch", top=60))
        shutil.copy(rep.with_suffix(".ncu-rep"), OUT / "mk.ncu-rep")
        log("megakernel details written")
    (OUT / "profile.json").write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()

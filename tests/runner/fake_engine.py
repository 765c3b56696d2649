"""A protocol-speaking stand-in engine for the runner's tests (docs/protocol.md).

--mode ok          answers every request (output ids are a deterministic function of the prompt)
--mode crash-after N   exits with status 3 after N requests
--mode segv-after N    kills itself with SIGSEGV after N requests
--mode hang-after N    stops answering after N requests
--mode garbage     prints a non-protocol line instead of the first result
--mode load-error  reports a load error and exits 1
--mode error-reply answers every request with a context_overflow error
--draft PATH       speculative: every reply carries `spec` counts (rounds of up to 3 committed tokens)
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--mode", default="ok")
    p.add_argument("--after", type=int, default=0)
    p.add_argument("--model", default="")
    p.add_argument("--decode-s-per-token", type=float, default=0.0005)
    p.add_argument("--draft")
    p.add_argument("--budget", type=int)
    p.add_argument("--chain", action="store_true")
    p.add_argument("--top-k", type=int)
    p.add_argument("--chain-seed", choices=["on", "off"])
    p.add_argument("--max-ctx", type=int)
    p.add_argument("--backend")
    p.add_argument("--device")
    p.add_argument("--kv-k")
    p.add_argument("--kv-v")
    args = p.parse_args()
    print("fake engine starting", file=sys.stderr, flush=True)
    if args.mode == "load-error":
        print(json.dumps({"type": "error", "kind": "load", "message": f"cannot open {args.model}/model.safetensors"}), flush=True)
        sys.exit(1)
    print(json.dumps({"type": "ready", "protocol": "lucebench.engine/v1",
                      "engine": {"name": "fake", "version": "1.0", "backend": "cpu", "build": {}},
                      "model": {"arch": "fake"}, "device": {"name": "cpu"}, "limits": {"max_ctx": 100000}}), flush=True)
    served = 0
    for line in sys.stdin:
        msg = json.loads(line)
        if msg["type"] == "shutdown":
            return
        if args.mode == "crash-after" and served >= args.after:
            print("fatal: simulated crash", file=sys.stderr, flush=True)
            sys.exit(3)
        if args.mode == "segv-after" and served >= args.after:
            os.kill(os.getpid(), signal.SIGSEGV)
        if args.mode == "hang-after" and served >= args.after:
            time.sleep(3600)
        if args.mode == "garbage":
            print("loading weights... 100%", flush=True)
            continue
        if args.mode == "error-reply":
            print(json.dumps({"type": "error", "id": msg["id"], "kind": "context_overflow", "message": "too long"}), flush=True)
            continue
        prompt, n_gen = msg["prompt_ids"], msg["n_gen"]
        t0 = time.monotonic_ns()
        time.sleep(len(prompt) * 1e-5)
        t1 = time.monotonic_ns()
        time.sleep((n_gen - 1) * args.decode_s_per_token)
        t2 = time.monotonic_ns()
        out = [(sum(prompt) * 31 + i * 7) % 1000 for i in range(n_gen)]
        reply = {"type": "result", "id": msg["id"], "output_ids": out, "n_prompt": len(prompt),
                 "n_gen": n_gen, "stop": "length", "decode_steps": n_gen - 1,
                 "timing": {"prefill_ms": (t1 - t0) / 1e6, "decode_ms": (t2 - t1) / 1e6,
                            "t_prefill_start_ns": t0, "t_prefill_end_ns": t1,
                            "t_decode_start_ns": t1, "t_decode_end_ns": t2},
                 "bytes_per_token": 1000.0}
        if args.draft:
            full, rest = divmod(n_gen - 1, 3)  # rounds committing 3 tokens, and one shorter last round
            hist = [0, 0, 0, full]
            if rest:
                hist[rest] += 1
            reply["decode_steps"] = sum(hist)
            reply["spec"] = {"draft_steps": sum(hist), "accepted_tokens": n_gen - 1, "al_histogram": hist,
                             "accepted_per_depth": [sum(hist[2:]), sum(hist[3:])]}
        print(json.dumps(reply), flush=True)
        served += 1


if __name__ == "__main__":
    main()

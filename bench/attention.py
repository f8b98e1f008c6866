#!/usr/bin/python3
"""scaled_dot_product_attention on the CPU against PyTorch 1.13's composed
softmax(q @ k.T * scale) @ v, in one run, alternating rounds, and the peak
memory each side adds while it runs. Use Debian's /usr/bin/python3.

    PYTHONPATH=build/python /usr/bin/python3 bench/attention.py [--shape 1,8,2048,64] [--causal]

Each round runs one side in its own process (best of --runs calls after a
warm-up), so neither side's allocations or threads disturb the other; the
PyTorch side gets bench/compare_torch.py's fair-anchor environment (an
OpenBLAS core type fitting this CPU, printed) and nothing else does. Peak
memory is the growth of the process's high-water mark (VmHWM) from after
set-up (inputs made, plan compiled) over the calls: the output and whatever
the computation holds at once. The score matrix is [..., S, S] f32.
"""
import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def hwm_bytes():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def side(which, shape, causal, runs, threads):
    import numpy as np
    rng = np.random.default_rng(0)
    q, k, v = (rng.uniform(-1, 1, shape).astype(np.float32) for _ in range(3))
    scale = 1.0 / np.sqrt(shape[-1])
    if which == "ours":
        import backplane
        g = backplane.Graph()
        for n in ("q", "k", "v"):
            g.input(n, "f32", list(shape))
        g.node("y", "scaled_dot_product_attention", ["q", "k", "v"], {"causal": causal})
        g.output("y")
        plan = backplane.compile(g, "cpu")
        feeds = {"q": q, "k": k, "v": v}

        def call():
            return plan(**feeds)["y"]
    else:
        import torch
        torch.set_num_threads(threads)
        tq, tk, tv = (torch.from_numpy(a) for a in (q, k, v))
        S, Sk = shape[-2], shape[-2]
        hidden = torch.triu(torch.ones(S, Sk, dtype=torch.bool), 1) if causal else None

        def call():
            with torch.no_grad():
                s = (tq @ tk.transpose(-2, -1)) * scale
                if hidden is not None:
                    s = s.masked_fill(hidden, float("-inf"))
                return torch.softmax(s, -1) @ tv
    base = hwm_bytes()
    y = call()  # the first call: its growth is the peak (the output's 4 bytes per element included)
    del y
    growth = hwm_bytes() - base
    best = float("inf")
    for _ in range(runs):
        t = time.perf_counter()
        y = call()
        best = min(best, time.perf_counter() - t)
        del y
    return {"seconds": best, "peak_growth": max(growth, hwm_bytes() - base)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="1,8,2048,64")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--side", choices=["ours", "torch"], help=argparse.SUPPRESS)
    a = ap.parse_args()
    shape = [int(x) for x in a.shape.split(",")]
    if a.side:
        print(json.dumps(side(a.side, shape, a.causal, a.runs, a.threads)))
        return
    sys.path.insert(0, HERE)
    from compare_torch import fair_torch_env
    torch_env, notes = fair_torch_env(False)
    ours_env = dict(os.environ, BACKPLANE_NUM_THREADS=str(a.threads))
    for n in notes:
        print(n)
    best = {"ours": [], "torch": []}
    peak = {"ours": 0, "torch": 0}
    for r in range(a.rounds):
        for who, env in (("ours", ours_env), ("torch", torch_env)) if r % 2 == 0 else (("torch", torch_env), ("ours", ours_env)):
            cmd = [sys.executable, __file__, "--side", who, "--shape", a.shape, "--runs", str(a.runs),
                   "--threads", str(a.threads)] + (["--causal"] if a.causal else [])
            out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
            res = json.loads(out.strip().splitlines()[-1])
            best[who].append(res["seconds"])
            peak[who] = max(peak[who], res["peak_growth"])
    scores = 4
    for d in shape[:-2]:
        scores *= d
    scores *= shape[-2] * shape[-2]
    o, t = min(best["ours"]), min(best["torch"])
    print(f"shape {shape}{' causal' if a.causal else ''}, f32, {a.threads} threads, best of {a.rounds} rounds x {a.runs} runs")
    print(f"ours  {o * 1e3:8.2f} ms   peak growth {peak['ours'] / 2**20:7.1f} MiB")
    print(f"torch {t * 1e3:8.2f} ms   peak growth {peak['torch'] / 2**20:7.1f} MiB (composed matmul/softmax/matmul)")
    print(f"score matrix {scores / 2**20:.1f} MiB; torch / ours time: {t / o:.2f}")


if __name__ == "__main__":
    main()

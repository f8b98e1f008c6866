#!/usr/bin/python3
"""Runs `backplane bench` and the same cases through Debian's PyTorch (CPU) in
one run, at 1 and 2 threads, and prints the ratio of speeds (ours / PyTorch;
above 1 means Backplane is faster). Use Debian's /usr/bin/python3.

    /usr/bin/python3 bench/compare_torch.py --backplane build/bin/backplane

Install libopenblas0-pthread first: without it Debian's python3-torch runs
matmul on the reference BLAS (~4 GFLOP/s) and the matmul ratios mean nothing.
"""
import argparse
import json
import os
import subprocess
import sys
import time


def torch_cases(torch):
    M = 4096
    g = torch.Generator().manual_seed(0)

    def r(*s):
        return torch.rand(*s, generator=g) * 2 - 1

    a16, b16, o16 = r(16 << 20), r(16 << 20), torch.empty(16 << 20)
    x, col, row, y = r(M, M), r(M, 1), r(1, M), r(M, M)
    out = torch.empty(M, M)
    m1a, m1b, m2a, m2b = r(1024, 1024), r(1024, 1024), r(2048, 2048), r(2048, 2048)
    cx, cw = r(8, 64, 56, 56), r(64, 64, 3, 3)
    one_a, one_b, one_o = r(1), r(1), torch.empty(1)
    c4 = r(4096)
    return {
        "add_16M": lambda: torch.add(a16, b16, out=o16),
        "add_bcast_col": lambda: torch.add(x, col, out=out),
        "add_bcast_row": lambda: torch.add(x, row, out=out),
        "add_transposed": lambda: torch.add(x.T, y, out=out),
        "sum_dim-1": lambda: x.sum(-1),
        "sum_dim0": lambda: x.sum(0),
        "softmax_dim-1": lambda: torch.softmax(x, -1),
        "topk8_dim-1": lambda: torch.topk(x, 8, -1),
        "var_mean_dim-1": lambda: torch.var_mean(x, -1),
        "matmul_1024": lambda: torch.matmul(m1a, m1b),
        "matmul_2048": lambda: torch.matmul(m2a, m2b),
        "conv2d_n8c64_56_k64_3x3": lambda: torch.nn.functional.conv2d(cx, cw, padding=1),
        "add_1elem_per_call": lambda: torch.add(one_a, one_b, out=one_o),
        "chain100_add_4K": lambda: [torch.add(c4, c4) for _ in range(100)],
    }


def time_fn(fn, min_time):
    fn()
    times = []
    start = time.perf_counter()
    batch = 1
    while True:
        t0 = time.perf_counter()
        for _ in range(batch):
            fn()
        dt = time.perf_counter() - t0
        if dt < 1e-3 and batch < 1 << 20:
            batch *= 10
            continue
        times.append(dt / batch)
        if time.perf_counter() - start > min_time and len(times) >= 5:
            break
    times.sort()
    return times[len(times) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--backplane", default="build/bin/backplane")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--filter", default="")
    ap.add_argument("--min-time", type=float, default=0.5)
    args = ap.parse_args()
    results = {}
    for threads in [int(t) for t in args.threads.split(",")]:
        cmd = [args.backplane, "bench", "--device", "cpu", "--json", "--threads", str(threads), "--min-time", str(args.min_time)]
        if args.filter:
            cmd += ["--filter", args.filter]
        ours = {r["case"]: r for r in json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)}
        # A fresh interpreter per thread count: OpenBLAS reads its variable at load.
        env = dict(os.environ, OPENBLAS_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads))
        code = ("import json, sys, torch; sys.path.insert(0, %r); import compare_torch as c; torch.set_num_threads(%d);"
                "cases = c.torch_cases(torch); print(json.dumps({k: c.time_fn(f, %f) for k, f in cases.items() if %r in k}))"
                % (os.path.dirname(os.path.abspath(__file__)), threads, args.min_time, args.filter))
        theirs = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                                           check=True).stdout)
        for case, r in ours.items():
            results.setdefault(case, {})[threads] = (r.get("seconds"), theirs.get(case), r.get("error"))
    thread_list = [int(t) for t in args.threads.split(",")]
    header = f"{'case':26s}" + "".join(f"{'ours ' + str(t) + 'T':>12s}{'torch ' + str(t) + 'T':>12s}{'ratio':>8s}" for t in thread_list)
    print(header)
    for case, per in results.items():
        line = f"{case:26s}"
        for t in thread_list:
            ours, theirs, err = per.get(t, (None, None, None))
            if err or ours is None or theirs is None:
                line += f"{'n/a':>12s}{'':>12s}{'':>8s}"
                continue
            fmt = lambda s: f"{s * 1e6:.2f}us" if s < 1e-3 else f"{s * 1e3:.2f}ms"
            line += f"{fmt(ours):>12s}{fmt(theirs):>12s}{theirs / ours:>8.2f}"
        print(line)
    print("ratio = PyTorch time / Backplane time (speed of ours over theirs; > 1 is faster)")


if __name__ == "__main__":
    main()

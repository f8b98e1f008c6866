#!/usr/bin/python3
"""Runs `backplane bench` and the same cases through Debian's PyTorch (CPU) in
one run, at 1 and 2 threads, and prints the ratio of speeds (PyTorch time /
ours; above 1 means Backplane is faster). Use Debian's /usr/bin/python3.

    /usr/bin/python3 bench/compare_torch.py --backplane build/bin/backplane

The PyTorch side is made a fair anchor first (and says so):

- Install libopenblas0-pthread: without it Debian's python3-torch runs f32
  matmul on the reference BLAS (~4 GFLOP/s) and the matmul ratios mean
  nothing; the script warns when it finds no OpenBLAS.
- Debian's OpenBLAS (0.3.21) does not know recent CPUs and picks the kernels
  of an older core (`Core: Prescott` on a Sapphire Rapids, `Haswell` on a
  Zen 4). When the core it reports is below what the CPU's instruction sets
  allow, the PyTorch side (only) runs with OPENBLAS_CORETYPE set to the best
  core type they allow, printed. Backplane's own runs and tests never get it.
- PyTorch's ATen kernels run at the capability it picked; where the CPU has
  AVX-512 and ATen picked less, the PyTorch side gets ATEN_CPU_CAPABILITY=avx512
  (printed; --torch-default keeps PyTorch's own choices for both).

It prints which BLAS kernel and which oneDNN ISA each side used, then per
case ours and PyTorch's times (each side's best of --rounds alternating runs)
and their ratio per thread count, then ours
bf16 against ours f32, 2 threads against 1, and each memory-bound case's
fraction of the `stream` roof (a plain C++ c = a + b loop, same run).
"""
import argparse
import json
import os
import re
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
    conv = torch.nn.functional.conv2d
    cases = {
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
        "conv2d_n8c64_56_k64_3x3": lambda: conv(cx, cw, padding=1),
        "add_1elem_per_call": lambda: torch.add(one_a, one_b, out=one_o),
        "chain100_add_4K": lambda: [torch.add(c4, c4) for _ in range(100)],
    }
    # The same shapes in bf16 and f16, where this PyTorch runs them on the
    # CPU (1.13 has no f16 matmul or conv2d there: those stay n/a).
    for dt, sfx in ((torch.bfloat16, "_bf16"), (torch.float16, "_f16")):
        h = {k: v.to(dt) for k, v in dict(m1a=m1a, m1b=m1b, m2a=m2a, m2b=m2b, cx=cx, cw=cw).items()}
        more = {
            "matmul_1024" + sfx: lambda h=h: torch.matmul(h["m1a"], h["m1b"]),
            "matmul_2048" + sfx: lambda h=h: torch.matmul(h["m2a"], h["m2b"]),
            "conv2d_n8c64_56_k64_3x3" + sfx: lambda h=h: conv(h["cx"], h["cw"], padding=1),
        }
        for k, f in more.items():
            try:
                f()
                cases[k] = f
            except RuntimeError:
                pass
    return cases


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


# OpenBLAS core types by the instruction sets they need, best first.
CORE_TYPES = [
    ("COOPERLAKE", {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16"}),
    ("SKYLAKEX", {"avx512f", "avx512bw", "avx512vl", "avx512dq"}),
    ("HASWELL", {"avx2", "fma"}),
    ("SANDYBRIDGE", {"avx"}),
    ("NEHALEM", {"sse4_2"}),
    ("PRESCOTT", set()),
]
# What OpenBLAS prints (OPENBLAS_VERBOSE=2: "Core: <name>") to the level of
# the instruction sets its kernels use (an index into CORE_TYPES).
CORE_LEVELS = {
    "cooperlake": 0, "sapphirerapids": 0,
    "skylakex": 1,
    "haswell": 2, "zen": 2, "skylake": 2, "excavator": 2,
    "sandybridge": 3, "bulldozer": 3, "piledriver": 3, "steamroller": 3,
    "nehalem": 4, "dunnington": 4, "penryn": 4, "barcelona": 4,
}


def cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def probe_torch(env):
    """What this PyTorch uses: the OpenBLAS core it reports (None when the BLAS
    is not OpenBLAS), its oneDNN's ISA line and its ATen CPU capability."""
    code = ("import sys, re, torch\n"
            "a = torch.rand(256, 256); a @ a\n"
            "x = torch.rand(1, 16, 8, 8).to(torch.bfloat16); w = torch.rand(16, 16, 3, 3).to(torch.bfloat16)\n"
            "torch.nn.functional.conv2d(x, w)\n"
            "sys.stdout.flush()\n"
            "m = re.search(r'CPU capability usage: (\\S+)', torch.__config__.show())\n"
            "print('ATEN_CAPABILITY', m.group(1) if m else '?')\n")
    env = dict(env, OPENBLAS_VERBOSE="2", DNNL_VERBOSE="1", ONEDNN_VERBOSE="1")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    text = p.stdout + p.stderr
    core = re.search(r"Core: (\S+)", text)
    isa = re.search(r"(?:dnnl|onednn)_verbose,info,cpu,isa:(.*)", text)
    cap = re.search(r"ATEN_CAPABILITY (\S+)", text)
    return (core.group(1) if core else None, isa.group(1).strip() if isa else "?", cap.group(1) if cap else "?")


def fair_torch_env(default_only):
    """The environment for the PyTorch side, and lines saying what was chosen."""
    env = dict(os.environ)
    notes = []
    flags = cpu_flags()
    core, isa, cap = probe_torch(env)
    if default_only:
        notes.append(f"PyTorch side: its own choices (--torch-default): OpenBLAS core {core}, ATen {cap}")
    else:
        if core is None:
            notes.append("WARNING: PyTorch's BLAS is not OpenBLAS (the reference BLAS?): install libopenblas0-pthread; "
                         "its f32 matmul is no fair anchor")
        else:
            best = next(i for i, (_, need) in enumerate(CORE_TYPES) if need <= flags)
            level = CORE_LEVELS.get(core.lower())
            if level is None or level > best:
                env["OPENBLAS_CORETYPE"] = CORE_TYPES[best][0]
                notes.append(f"PyTorch side: OpenBLAS reports core {core}, below what this CPU allows: "
                             f"OPENBLAS_CORETYPE={CORE_TYPES[best][0]} for the PyTorch side only")
        if {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags and cap.upper() not in ("AVX512", "?"):
            env["ATEN_CPU_CAPABILITY"] = "avx512"
            notes.append(f"PyTorch side: ATen picked {cap}; ATEN_CPU_CAPABILITY=avx512 for the PyTorch side only")
        core, isa, cap = probe_torch(env)
    notes.append(f"PyTorch side: BLAS kernel {'OpenBLAS ' + core if core else 'not OpenBLAS'}, ATen {cap}, "
                 f"oneDNN ISA: {isa}")
    return env, notes


def fmt(s):
    return f"{s * 1e6:.2f}us" if s < 1e-3 else f"{s * 1e3:.2f}ms"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--backplane", default="build/bin/backplane")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--filter", default="")
    ap.add_argument("--min-time", type=float, default=0.5)
    ap.add_argument("--torch-default", action="store_true", help="no fair-anchor environment for the PyTorch side")
    ap.add_argument("--rounds", type=int, default=2,
                    help="run both sides this many times, alternating, and keep each case's best time per side "
                         "(a busy machine slows whichever side it catches)")
    args = ap.parse_args()
    torch_env, notes = fair_torch_env(args.torch_default)
    for n in notes:
        print(n)
    results = {}
    stream = {}
    fractions = {}
    thread_list = [int(t) for t in args.threads.split(",")]
    described = False
    for threads in [t for _ in range(max(1, args.rounds)) for t in thread_list]:
        cmd = [args.backplane, "bench", "--device", "cpu", "--json", "--threads", str(threads), "--min-time", str(args.min_time)]
        if args.filter:
            cmd += ["--filter", args.filter]
        records = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
        ours = {}
        for r in records:
            if r["case"] == "stream":
                if threads not in stream or r["gbps"] > stream[threads]["gbps"]:
                    stream[threads] = r
            elif r["case"] != "startup":
                if not described and r.get("description"):
                    print(f"Backplane side: {r['description']} (own GEMM kernels where oneDNN is not named)")
                    described = True
                ours[r["case"]] = r
                if "stream_fraction" in r:
                    prev = fractions.setdefault(r["case"], {}).get(threads, 0)
                    fractions[r["case"]][threads] = max(prev, r["stream_fraction"])
        # A fresh interpreter per thread count: OpenBLAS reads its variables at load.
        env = dict(torch_env, OPENBLAS_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads))
        code = ("import json, sys, torch; sys.path.insert(0, %r); import compare_torch as c; torch.set_num_threads(%d);"
                "cases = c.torch_cases(torch); print(json.dumps({k: c.time_fn(f, %f) for k, f in cases.items() if %r in k}))"
                % (os.path.dirname(os.path.abspath(__file__)), threads, args.min_time, args.filter))
        theirs = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                                           check=True).stdout)
        for case, r in ours.items():
            new = (r.get("seconds"), theirs.get(case), r.get("error"))
            old = results.setdefault(case, {}).get(threads)
            if old is not None:  # best of the rounds, per side
                best = lambda x, y: y if x is None else x if y is None else min(x, y)
                new = (best(old[0], new[0]), best(old[1], new[1]), old[2] or new[2])
            results[case][threads] = new
    header = f"{'case':32s}" + "".join(f"{'ours ' + str(t) + 'T':>12s}{'torch ' + str(t) + 'T':>12s}{'ratio':>8s}" for t in thread_list)
    print(header)
    for case, per in results.items():
        line = f"{case:32s}"
        for t in thread_list:
            ours, theirs, err = per.get(t, (None, None, None))
            if err or ours is None:
                line += f"{'n/a':>12s}{'':>12s}{'':>8s}"
                continue
            if theirs is None:
                line += f"{fmt(ours):>12s}{'n/a':>12s}{'':>8s}"
                continue
            line += f"{fmt(ours):>12s}{fmt(theirs):>12s}{theirs / ours:>8.2f}"
        print(line)
    print("ratio = PyTorch time / Backplane time (speed of ours over theirs; > 1 is faster)")

    def ours_at(case, t):
        v = results.get(case, {}).get(t)
        return v[0] if v and not v[2] else None

    last = thread_list[-1]
    print()
    for base in ("matmul_1024", "matmul_2048", "conv2d_n8c64_56_k64_3x3"):
        for sfx in ("_bf16", "_f16"):
            f32, low = ours_at(base, last), ours_at(base + sfx, last)
            if f32 and low:
                print(f"ours {base + sfx} vs ours f32 at {last}T: {f32 / low:.2f}x as fast")
    if len(thread_list) >= 2:
        one, many = thread_list[0], thread_list[-1]
        print()
        print(f"ours {many}T over ours {one}T (time {one}T / time {many}T; >= 1: no slowdown from threads)")
        for case in results:
            a, b = ours_at(case, one), ours_at(case, many)
            if a and b:
                print(f"  {case:32s}{a / b:8.2f}{'   SLOWER' if a / b < 0.97 else ''}")
    if stream:
        print()
        print("memory-bound cases, fraction of the stream roof (plain C++ c = a + b, 16M f32; best of the rounds):")
        print("  " + "  ".join(f"stream {t}T: {stream[t]['gbps']:.1f} GB/s" for t in thread_list if t in stream))
        for case, per in fractions.items():
            print(f"  {case:32s}" + "".join(f"{str(t) + 'T ' + format(per[t] * 100, '.0f') + '%':>10s}" for t in thread_list if t in per))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""A two-layer MLP (batch 32, 256 -> 512 -> 10) with its weights uploaded once
as device tensors, run on each device and checked against NumPy.

    PYTHONPATH=build/python /usr/bin/python3 examples/python/mlp.py [--device cpu] [--check] [--runs N]

Per device it prints the per-run time with the weights resident (uploaded
once, read in place by every run) against the same plan given the weights as
NumPy arrays on every run (copied in each time).
"""

import argparse
import sys
import time

import numpy as np

import backplane

BATCH, IN, HIDDEN, OUT = 32, 256, 512, 10


def mlp_graph():
    g = backplane.Graph()
    g.input("x", "f32", [BATCH, IN])
    g.input("w1", "f32", [IN, HIDDEN])
    g.input("b1", "f32", [HIDDEN])
    g.input("w2", "f32", [HIDDEN, OUT])
    g.input("b2", "f32", [OUT])
    g.node("xw", "matmul", ["x", "w1"])
    g.node("pre", "add", ["xw", "b1"])  # b1 broadcasts over the batch
    g.node("h", "relu", ["pre"])
    g.node("hw", "matmul", ["h", "w2"])
    g.node("y", "add", ["hw", "b2"])
    g.output("y")
    return g


def reference(x, w):
    h = np.maximum(x.astype(np.float64) @ w["w1"] + w["b1"], 0)
    return h @ w["w2"] + w["b2"]


def per_run_seconds(fn, runs):
    fn()  # warm
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(runs):
            fn()
        best = min(best, (time.perf_counter() - t0) / runs)
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", action="append", help="a device (repeatable; default: cpu and every Vulkan device)")
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--check", action="store_true", help="check only (no timing): what ctest runs")
    args = ap.parse_args()

    rng = np.random.default_rng(0)
    weights = {
        "w1": (rng.standard_normal((IN, HIDDEN)) / np.sqrt(IN)).astype(np.float32),
        "b1": rng.standard_normal(HIDDEN).astype(np.float32) * 0.1,
        "w2": (rng.standard_normal((HIDDEN, OUT)) / np.sqrt(HIDDEN)).astype(np.float32),
        "b2": rng.standard_normal(OUT).astype(np.float32) * 0.1,
    }
    rt = backplane.runtime()
    names = args.device or [d["name"] for d in rt.devices()
                            if d["state"] == "loaded" and d["plugin"] in ("cpu", "vulkan")]
    graph = mlp_graph()
    for name in names:
        plan = rt.compile(graph, name)
        # Weights uploaded once: every run reads them where they are.
        for k, v in weights.items():
            plan.set_input(k, rt.upload(v, name))
        for step in range(3):
            x = rng.standard_normal((BATCH, IN)).astype(np.float32)
            y = plan(x=x)["y"]
            err = np.max(np.abs(y - reference(x, weights)))
            if not err <= 1e-3:
                print(f"{name}: batch {step}: max error {err:.3g} against NumPy", file=sys.stderr)
                return 1
        print(f"{name}: matches NumPy (max error {err:.2g})")
        if args.check:
            continue
        x = rng.standard_normal((BATCH, IN)).astype(np.float32)
        resident = per_run_seconds(lambda: plan(x=x), args.runs)
        again = rt.compile(graph, name)

        def reupload_run():
            for k, v in weights.items():
                again.set_input(k, v, copy=True)  # copied into the plan's buffers each run
            return again(x=x)

        reupload = per_run_seconds(reupload_run, args.runs)
        print(f"{name}: per run {resident * 1e6:9.1f} us with weights resident, "
              f"{reupload * 1e6:9.1f} us re-uploading them ({reupload / resident:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/python3
"""Graph files through `backplane run` against NumPy's answers, on every device.

Writes each graph and its .npy inputs into --work, runs the command on each
loaded device, and compares every output with NumPy in float64 within the
docs/ops.md tolerances.
"""
import argparse
import json
import os
import subprocess
import sys

import numpy as np

rng = np.random.default_rng(7)


def f32(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def softmax(x, axis):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def topk(x, k):
    order = np.argsort(-x, axis=-1, kind="stable")[..., :k]
    return np.take_along_axis(x, order, -1), order


def bf16_bits(x):
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def bf16_value(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


def pool2d(x, k, s, pad, dil=(1, 1), ceil=False, avg=False, include_pad=True):
    """max_pool2d / avg_pool2d as docs/ops.md says, window by window in float64."""
    n_, c_, h, w = x.shape
    size = []
    for d, (n, p0, p1) in enumerate(((h, pad[0], pad[2]), (w, pad[1], pad[3]))):
        q = n + p0 + p1 - dil[d] * (k[d] - 1) - 1
        o = (-(-q // s[d]) if ceil else q // s[d]) + 1
        if ceil and (o - 1) * s[d] >= n + p0:
            o -= 1
        size.append(o)
    y = np.empty((n_, c_, size[0], size[1]))
    xd = x.astype(np.float64)
    for oh in range(size[0]):
        for ow in range(size[1]):
            rows = [oh * s[0] + i * dil[0] for i in range(k[0])]  # padded coordinates
            cols = [ow * s[1] + j * dil[1] for j in range(k[1])]
            rin = [r - pad[0] for r in rows if 0 <= r - pad[0] < h]
            cin = [c - pad[1] for c in cols if 0 <= c - pad[1] < w]
            win = xd[:, :, rin][:, :, :, cin]
            if not avg:
                y[:, :, oh, ow] = win.max(axis=(2, 3)) if rin and cin else -np.inf
            else:
                if include_pad:
                    cnt = sum(r < h + pad[0] + pad[2] for r in rows) * sum(c < w + pad[1] + pad[3] for c in cols)
                else:
                    cnt = len(rin) * len(cin)
                y[:, :, oh, ow] = win.sum(axis=(2, 3)) / cnt
    return y


def cases():
    a, b = f32(4, 1, 3), f32(5, 1)
    yield "broadcast", {"a": a, "b": b}, {
        "inputs": {"a": "a.npy", "b": "b.npy", "k": {"value": [1.0, 2.0, 3.0], "dtype": "f32"}},
        "nodes": [{"name": "s", "op": "add", "inputs": ["a", "b"]},
                  {"name": "y", "op": "mul", "inputs": ["s", "k"]}],
        "outputs": ["y"]}, {"y": (a.astype(np.float64) + b) * np.array([1.0, 2.0, 3.0])}, 1e-5

    x, y = f32(3, 5), f32(5, 3)
    yield "transposed", {"x": x, "y": y}, {
        "inputs": {"x": "x.npy", "y": "y.npy"},
        "nodes": [{"name": "t", "op": "transpose", "inputs": ["x"], "params": {"dim0": 0, "dim1": 1}},
                  {"name": "d", "op": "sub", "inputs": ["t", "y"]}],
        "outputs": ["d", "t"]}, {"d": x.T.astype(np.float64) - y, "t": x.T}, 1e-5

    x = f32(10, 6)
    yield "sliced", {"x": x}, {
        "inputs": {"x": "x.npy"},
        "nodes": [{"name": "r", "op": "slice", "inputs": ["x"], "params": {"dim": 0, "start": 8, "step": -2}},
                  {"name": "c", "op": "slice", "inputs": ["r"], "params": {"dim": 1, "start": 1, "end": 5}},
                  {"name": "e", "op": "exp", "inputs": ["c"]}],
        "outputs": ["e"]}, {"e": np.exp(x[8::-2, 1:5].astype(np.float64))}, 1e-5

    x = f32(3, 7)
    vals, idx = topk(x.astype(np.float64), 3)
    var = x.astype(np.float64).var(axis=1, ddof=1)
    mean = x.astype(np.float64).mean(axis=1)
    yield "bundles", {"x": x}, {
        "inputs": {"x": "x.npy"},
        "nodes": [{"name": "t", "op": "topk", "inputs": ["x"], "params": {"k": 3}},
                  {"name": "vals", "op": "view", "inputs": ["t"], "params": {"slot": 0}},
                  {"name": "idx", "op": "view_owned", "inputs": ["t"], "params": {"slot": 1}},
                  {"name": "vm", "op": "var_mean", "inputs": ["x"], "params": {"dims": [1]}},
                  {"name": "var", "op": "view", "inputs": ["vm"], "params": {"slot": 0}},
                  {"name": "mean", "op": "view_owned", "inputs": ["vm"], "params": {"slot": 1}}],
        "outputs": ["vals", "idx", "var", "mean"]}, {"vals": vals, "idx": idx, "var": var, "mean": mean}, 1e-4

    a, b = f32(2, 3, 4), f32(4, 5)
    yield "matmul_softmax", {"a": a, "b": b}, {
        "inputs": {"a": "a.npy", "b": "b.npy"},
        "nodes": [{"name": "m", "op": "matmul", "inputs": ["a", "b"]},
                  {"name": "p", "op": "softmax", "inputs": ["m"], "params": {"dim": -1}}],
        "outputs": ["p"]}, {"p": softmax(a.astype(np.float64) @ b, -1)}, 1e-4

    x, y = f32(6), f32(2, 6)
    yield "where_cast", {"x": x, "y": y}, {
        "inputs": {"x": "x.npy", "y": "y.npy", "zero": {"value": 0.0, "dtype": "f32"}},
        "nodes": [{"name": "pos", "op": "gt", "inputs": ["x", "zero"]},
                  {"name": "w", "op": "where", "inputs": ["pos", "x", "y"]},
                  {"name": "n", "op": "cast", "inputs": ["pos"], "params": {"dtype": "i32"}}],
        "outputs": ["w", "n"]}, {"w": np.where(x > 0, x, y), "n": (x > 0).astype(np.int32)}, 1e-5

    bits = bf16_bits(f32(4, 4))
    yield "bf16_input", {"h": bits}, {
        "inputs": {"h": {"file": "h.npy", "dtype": "bf16"}},
        "nodes": [{"name": "f", "op": "cast", "inputs": ["h"], "params": {"dtype": "f32"}},
                  {"name": "s", "op": "sum", "inputs": ["f"], "params": {"dims": [0]}}],
        "outputs": ["f", "s"]}, {"f": bf16_value(bits), "s": bf16_value(bits).astype(np.float64).sum(0)}, 1e-4

    # A CNN's pooling (ResNet's stem, then a ceil_mode average with uneven
    # padding that leaves padding out of the divisor).
    x = f32(2, 3, 9, 10)
    m = pool2d(x, (3, 3), (2, 2), (1, 1, 1, 1))
    a = pool2d(m, (2, 3), (2, 2), (0, 1, 1, 0), ceil=True, avg=True, include_pad=False)
    d = pool2d(x, (2, 2), (1, 3), (1, 0, 0, 2), dil=(2, 1), ceil=True, avg=True)
    yield "pool2d", {"x": x}, {
        "inputs": {"x": "x.npy"},
        "nodes": [{"name": "m", "op": "max_pool2d", "inputs": ["x"],
                   "params": {"kernel_size": 3, "stride": 2, "padding": 1}},
                  {"name": "a", "op": "avg_pool2d", "inputs": ["m"],
                   "params": {"kernel_size": [2, 3], "stride": 2, "padding": [0, 1, 1, 0], "ceil_mode": True,
                              "count_include_pad": False}},
                  {"name": "d", "op": "avg_pool2d", "inputs": ["x"],
                   "params": {"kernel_size": 2, "stride": [1, 3], "padding": [1, 0, 0, 2], "dilation": [2, 1],
                              "ceil_mode": True}}],
        "outputs": ["m", "a", "d"]}, {"m": m, "a": a, "d": d}, 1e-4


def devices(backplane):
    out = subprocess.run([backplane, "devices", "--json", "--load"], capture_output=True, text=True, check=True)
    listing = json.loads(out.stdout)
    return [d["name"] for d in listing["devices"] if d["state"] == "loaded" and d["kernels"] > 0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--backplane", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--list", action="append", default=[],
                    help="also run every graph on this device list (acme0,cpu); skipped unless every device is loaded")
    args = ap.parse_args()
    devs = devices(args.backplane)
    if not devs:
        print("no devices loaded")
        return 1
    loaded = set(devs)
    for lst in args.list:
        if lst == "auto" or all(d in loaded for d in lst.split(",")):
            devs.append(lst)
        else:
            print(f"skip the list {lst}: not every device is loaded here")
    failures = 0
    checks = 0
    for name, inputs, graph, expected, tol in cases():
        folder = os.path.join(args.work, name)
        os.makedirs(folder, exist_ok=True)
        for k, v in inputs.items():
            np.save(os.path.join(folder, k + ".npy"), v)
        with open(os.path.join(folder, "graph.json"), "w") as f:
            json.dump(graph, f, indent=1)
        for dev in devs:
            out_dir = os.path.join(folder, "out_" + dev.replace(",", "_"))
            r = subprocess.run([args.backplane, "run", os.path.join(folder, "graph.json"), "--device", dev, "--out", out_dir],
                               capture_output=True, text=True)
            if r.returncode != 0:
                # A device that lacks a kernel says so; that is not a wrong answer.
                if "has no kernel" in r.stderr and "cpu" not in dev.split(","):
                    print(f"skip {name} on {dev}: {r.stderr.strip()}")
                    continue
                print(f"FAIL {name} on {dev}: exit {r.returncode}: {r.stderr.strip()}")
                failures += 1
                continue
            for out_name, want in expected.items():
                got = np.load(os.path.join(out_dir, out_name + ".npy"))
                want = np.asarray(want)
                checks += 1
                if got.shape != want.shape:
                    print(f"FAIL {name}/{out_name} on {dev}: shape {got.shape} != {want.shape}")
                    failures += 1
                    continue
                if got.dtype.kind in "iub":
                    ok = np.array_equal(got, want)
                else:
                    g, w = got.astype(np.float64), want.astype(np.float64)
                    err = np.abs(g - w)
                    ok = bool(np.all((err <= tol * np.abs(w)) | (err <= 1e-6)))
                if not ok:
                    print(f"FAIL {name}/{out_name} on {dev}:\n got {got}\n want {want}")
                    failures += 1
                else:
                    print(f"ok   {name}/{out_name} on {dev}")
    print(f"{checks - failures} passed, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

"""Runs one model of the set (tests/models/models.py) through Backplane on
each device list given and compares with PyTorch, the reference: every
output within tolerance of the module's (errors scaled by the output's
largest magnitude), and for classifiers PyTorch's top-5 classes also in
ours. Exits 77 (a ctest skip) when torchvision or a device is missing, after
checking the devices that are there; 1 on any mismatch.

    check_model.py resnet18 --device cpu --device vulkan0 --device vulkan0,cpu [--cli build/bin/backplane] [--from-torch]
"""

import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np

SKIP = 77
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def compare(name, have, want, rtol, kind, label):
    have = np.asarray(have, np.float64)
    want = np.asarray(want, np.float64)
    if have.shape != want.shape:
        return "%s: shape %s, PyTorch %s" % (label, have.shape, want.shape)
    scale = float(np.max(np.abs(want))) if want.size else 1.0
    err = float(np.max(np.abs(have - want))) if want.size else 0.0
    msg = "%s: max |error| %.3g (%.2g of max |y| %.3g)" % (label, err, err / max(scale, 1e-30), scale)
    if not np.all(np.isfinite(have)):
        return msg + ": non-finite values"
    if err > rtol * max(scale, 1e-30):
        return msg + ": above the bound %.2g" % rtol
    if kind == "classifier":
        for row_h, row_w in zip(have.reshape(-1, have.shape[-1]), want.reshape(-1, want.shape[-1])):
            top5 = np.argsort(-row_w)[:5]
            fifth = np.sort(row_h)[-5]
            # Each of PyTorch's top 5 is among ours (ties within the error allowed).
            missing = [int(c) for c in top5 if row_h[c] < fifth - 2 * err]
            if missing:
                return msg + ": PyTorch's top-5 classes %s not in ours (%s)" % (
                    list(map(int, top5)), list(map(int, np.argsort(-row_h)[:5])))
    print("  ok   " + msg)
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--device", action="append", help="a device list to run on (repeatable; default cpu)")
    ap.add_argument("--cli", help="also run the model through this `backplane` (run MODEL.onnx, import + run)")
    ap.add_argument("--from-torch", action="store_true", help="bring the module in with backplane.from_torch")
    ap.add_argument("--rtol", type=float, default=1e-4, help="bound on max |error| / max |y|")
    args = ap.parse_args()
    try:
        import torch  # noqa: F401
        import torchvision  # noqa: F401
    except ImportError as e:
        print("SKIP: %s (Debian: python3-torch, python3-torchvision)" % e)
        return SKIP
    import backplane
    import models

    have_devices = {d["name"] for d in backplane.devices() if d.get("name")}
    failures, skipped = [], []
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, args.model + ".onnx")
        module, inputs, kind = models.export(args.model, path)
        import torch
        with torch.no_grad():
            want = module(*inputs).numpy()
        feeds = {"input": inputs[0].numpy()}
        if args.from_torch:
            graph = backplane.from_torch(module, *inputs, check=False, input_names=["input"], output_names=["output"])
        else:
            m = backplane.onnx.load_model(path)
            print("  %s imported: %s" % (args.model, "; ".join(m.notes)))
            graph = m.graph
        for dev in args.device or ["cpu"]:
            missing = [d for d in dev.split(",") if d not in have_devices]
            if missing:
                skipped.append("%s (no device %s)" % (dev, ",".join(missing)))
                continue
            plan = backplane.compile(graph, device=dev)
            out = plan(**feeds)["output"]
            f = compare(args.model, out, want, args.rtol, kind, "%s on %s" % (args.model, dev))
            if f:
                failures.append(f)
        if args.cli:
            x = os.path.join(tmp, "x.npy")
            np.save(x, feeds["input"])
            out_dir = os.path.join(tmp, "out")
            subprocess.run([args.cli, "run", path, "--input", "input=" + x, "--device", "cpu", "--out", out_dir],
                           check=True)
            f = compare(args.model, np.load(os.path.join(out_dir, "output.npy")), want, args.rtol, kind,
                        "%s via `backplane run MODEL.onnx`" % args.model)
            if f:
                failures.append(f)
            gdir = os.path.join(tmp, "imported")
            subprocess.run([args.cli, "import", path, "--out", gdir, "--input", "input=" + x], check=True)
            out2 = os.path.join(tmp, "out2")
            subprocess.run([args.cli, "run", os.path.join(gdir, "graph.json"), "--input", "input=" + x,
                            "--device", "cpu", "--out", out2], check=True)
            f = compare(args.model, np.load(os.path.join(out2, "output.npy")), want, args.rtol, kind,
                        "%s via `backplane import` + run" % args.model)
            if f:
                failures.append(f)
    for f in failures:
        print("FAIL " + f)
    if failures:
        return 1
    if skipped:
        print("SKIP (not run): " + "; ".join(skipped))
        return SKIP
    return 0


if __name__ == "__main__":
    sys.exit(main())

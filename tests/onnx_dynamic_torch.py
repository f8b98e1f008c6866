"""A PyTorch attention block exported with dynamic_axes (seq), imported with
the seq dim kept dynamic, compiled once and run at several lengths against
PyTorch's outputs (the C++ side is the hidden case "[.onnx_dynamic_torch]"
of tests/test_onnx_dynamic.cpp, which this runs).

    onnx_dynamic_torch.py --tests build/bin/backplane_tests --work DIR

Exits 77 (a ctest skip) when PyTorch is missing. Nothing is downloaded: the
block has random weights of a fixed seed.
"""

import argparse
import json
import os
import subprocess
import sys

SKIP = 77
LENGTHS = [5, 9, 2, 9]  # the first is the trial size; 9 again: no new compile


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tests", required=True, help="the backplane_tests binary")
    ap.add_argument("--work", required=True, help="a folder for the model and the .npy files")
    ap.add_argument("--cli", help="the backplane program: also `import --dynamic` and run the graph file")
    args = ap.parse_args()
    try:
        import numpy as np
        import torch
    except ImportError as e:
        print("skipped: %s" % e)
        return SKIP

    torch.manual_seed(7)

    class Attention(torch.nn.Module):
        # x.view(b, s, h, d) with b, s read from x's shape: the Shape ->
        # Gather -> Unsqueeze -> Concat -> Reshape chains dynamic_axes makes.
        def __init__(self, dim=32, heads=4):
            super().__init__()
            self.heads = heads
            self.qkv = torch.nn.Linear(dim, 3 * dim)
            self.out = torch.nn.Linear(dim, dim)
            self.norm = torch.nn.LayerNorm(dim)

        def forward(self, x):
            b, s, c = x.shape
            h = self.heads
            q, k, v = self.qkv(self.norm(x)).chunk(3, dim=-1)
            q = q.view(b, s, h, c // h).transpose(1, 2)
            k = k.view(b, s, h, c // h).transpose(1, 2)
            v = v.view(b, s, h, c // h).transpose(1, 2)
            a = torch.softmax(q @ k.transpose(-1, -2) / (c // h) ** 0.5, dim=-1)
            y = (a @ v).transpose(1, 2).reshape(b, s, c)
            return x + self.out(y)

    m = Attention().eval()
    os.makedirs(args.work, exist_ok=True)
    path = os.path.join(args.work, "model.onnx")
    with torch.no_grad():
        torch.onnx.export(m, (torch.randn(1, 7, 32),), path, input_names=["x"], output_names=["y"],
                          dynamic_axes={"x": {1: "seq"}, "y": {1: "seq"}}, opset_version=13)
        for s in sorted(set(LENGTHS)):
            x = torch.randn(1, s, 32)
            np.save(os.path.join(args.work, "x_%d.npy" % s), x.numpy())
            np.save(os.path.join(args.work, "y_%d.npy" % s), m(x).numpy())
    with open(os.path.join(args.work, "lengths.txt"), "w") as f:
        f.write(" ".join(map(str, LENGTHS)) + "\n")
    env = dict(os.environ, BACKPLANE_TORCH_DYN_DIR=args.work)
    rc = subprocess.call([args.tests, "[.onnx_dynamic_torch]"], env=env)
    if rc != 0 or not args.cli:
        return rc
    # Would catch: the flag not reaching the importer (a fixed [1, 7, 32]
    # input), or a graph file that runs at one length only.
    out_dir = os.path.join(args.work, "imported")
    subprocess.check_call([args.cli, "import", path, "--out", out_dir, "--dynamic", "--dim", "seq=6"])
    with open(os.path.join(out_dir, "graph.json")) as f:
        shape = json.load(f)["inputs"]["x"]["shape"]
    if shape != [1, "seq", 32]:
        print("FAIL: import --dynamic wrote x as %s, not [1, \"seq\", 32]" % shape)
        return 1
    for s in sorted(set(LENGTHS)):
        res = os.path.join(args.work, "run_%d" % s)
        subprocess.check_call([args.cli, "run", os.path.join(out_dir, "graph.json"), "--device", "cpu",
                               "--input", "x=" + os.path.join(args.work, "x_%d.npy" % s), "--out", res],
                              stdout=subprocess.DEVNULL)
        got = np.load(os.path.join(res, "y.npy"))
        want = np.load(os.path.join(args.work, "y_%d.npy" % s))
        err = float(np.max(np.abs(got - want)))
        print("graph file at seq=%d: max |error| %.2e" % (s, err))
        if got.shape != want.shape or err > 1e-4 * float(np.max(np.abs(want))):
            print("FAIL: the imported graph file at seq=%d" % s)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

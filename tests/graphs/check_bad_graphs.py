#!/usr/bin/python3
"""Every bad graph gets one clear error line naming the problem and a non-zero
exit: never a crash, an abort or a stack trace."""
import argparse
import json
import os
import subprocess
import sys

import numpy as np

CASES = [
    ("unknown_op", {"inputs": {"x": "x.npy"}, "nodes": [{"name": "y", "op": "frobnicate", "inputs": ["x"]}],
                    "outputs": ["y"]}, "node 'y': unknown op 'frobnicate'"),
    ("bad_broadcast", {"inputs": {"x": "x.npy", "z": {"value": [1, 2, 3], "dtype": "f32"}},
                       "nodes": [{"name": "y", "op": "add", "inputs": ["x", "z"]}], "outputs": ["y"]},
     "node 'y' (add): shapes [2, 4] and [3] do not broadcast"),
    ("missing_file", {"inputs": {"x": "nope.npy"}, "nodes": [], "outputs": ["x"]}, "graph input 'x'"),
    ("unknown_param", {"inputs": {"x": "x.npy"}, "nodes": [{"name": "y", "op": "relu", "inputs": ["x"],
                                                            "params": {"alpha": 0.1}}], "outputs": ["y"]},
     "unknown param 'alpha'"),
    ("bundle_output", {"inputs": {"x": "x.npy"}, "nodes": [{"name": "t", "op": "topk", "inputs": ["x"],
                                                            "params": {"k": 2}}], "outputs": ["t"]}, "bundle"),
    ("undefined_input", {"inputs": {"x": "x.npy"}, "nodes": [{"name": "y", "op": "relu", "inputs": ["w"]}],
                         "outputs": ["y"]}, "node 'y' (relu): input 'w' is not defined"),
    ("index_out_of_range", {"inputs": {"x": "x.npy", "i": {"value": [0, 7], "dtype": "i64"}},
                            "nodes": [{"name": "g", "op": "index_select", "inputs": ["x", "i"], "params": {"dim": 1}}],
                            "outputs": ["g"]}, "node 'g' (index_select"),
    ("int_div_zero", {"inputs": {"a": {"value": [4, 5], "dtype": "i32"}, "b": {"value": [2, 0], "dtype": "i32"}},
                      "nodes": [{"name": "q", "op": "div", "inputs": ["a", "b"]}], "outputs": ["q"]}, "node 'q' (div"),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--backplane", required=True)
    ap.add_argument("--work", required=True)
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    np.save(os.path.join(args.work, "x.npy"), np.ones((2, 4), np.float32))
    failures = 0
    for name, graph, expect in CASES:
        path = os.path.join(args.work, name + ".json")
        with open(path, "w") as f:
            json.dump(graph, f)
        r = subprocess.run([args.backplane, "run", path, "--device", "cpu"], capture_output=True, text=True)
        lines = [l for l in r.stderr.splitlines() if l.strip()]
        ok = r.returncode == 1 and len(lines) == 1 and expect in lines[0] and lines[0].startswith("backplane: error:")
        print(("ok   " if ok else "FAIL ") + name + ": exit " + str(r.returncode) + ": " + r.stderr.strip())
        failures += not ok
    malformed = os.path.join(args.work, "malformed.json")
    with open(malformed, "w") as f:
        f.write("{\"nodes\": [")
    r = subprocess.run([args.backplane, "run", malformed], capture_output=True, text=True)
    ok = r.returncode == 1 and "malformed JSON" in r.stderr
    print(("ok   " if ok else "FAIL ") + "malformed: " + r.stderr.strip())
    failures += not ok
    print(f"{len(CASES) + 1 - failures} passed, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

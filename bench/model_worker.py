"""One side of bench/compare_models.py: Backplane (--side backplane) or
PyTorch eager (--side torch) timing whole models. Reads "load NAME PATH
DEVICE" and "time NAME COUNT" lines on stdin, answers one JSON line each."""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "models"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--side", choices=["backplane", "torch"], required=True)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    import torch
    import models
    torch.set_num_threads(args.threads)
    runners = {}
    for line in sys.stdin:
        w = line.split()
        try:
            if w[0] == "load":
                name, path, device = w[1], w[2], w[3]
                module, inputs, _ = models.build(name)
                if args.side == "torch":
                    def run(module=module, inputs=inputs):
                        with torch.no_grad():
                            module(*inputs)
                else:
                    import backplane
                    m = backplane.onnx.load_model(path)
                    plan = backplane.compile(m.graph, device=device)
                    feeds = {n: x.numpy() for n, x in zip(m.inputs, inputs)}

                    def run(plan=plan, feeds=feeds):
                        plan(**feeds)
                run()
                runners[name] = run
                print(json.dumps({"ok": True}), flush=True)
            elif w[0] == "time":
                run, times = runners[w[1]], []
                for _ in range(int(w[2])):
                    t0 = time.perf_counter()
                    run()
                    times.append((time.perf_counter() - t0) * 1e3)
                print(json.dumps({"times": times}), flush=True)
            elif w[0] == "quit":
                return
        except Exception as e:  # noqa: BLE001 (reported to the driver)
            print(json.dumps({"error": "%s: %s" % (type(e).__name__, e)}), flush=True)


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""Whole models, batch 1: Backplane against ONNX Runtime's CPU provider and
PyTorch eager, in one process tree, alternating rounds. Prints each model's
median latency per side and the ratios (their time / ours: above 1 means
Backplane is faster). Use Debian's /usr/bin/python3.

    /usr/bin/python3 bench/compare_models.py --build build --ort /tmp/ort/node_modules [--models resnet18,encoder]

- Models come from tests/models/models.py (torchvision architectures and two
  hand-written transformers, random weights), exported to ONNX (opset 13).
- ONNX Runtime is an anchor only, never a dependency: install it beside the
  project with `npm install --ignore-scripts onnxruntime-node` (its install
  script fetches from a host this machine cannot reach; the npm package
  ships libonnxruntime itself) and pass its node_modules with --ort. It runs
  with intra-op threads = --threads, graph optimisation level "all".
- PyTorch runs eager under no_grad with torch.set_num_threads(--threads), in
  the fair-anchor environment of bench/compare_torch.py (an OpenBLAS core
  type fitting this CPU for the PyTorch side only, printed).
- Backplane runs the imported model through a reused plan with
  BACKPLANE_NUM_THREADS = --threads on --device.
- Before each side's timed runs the script waits until no worker process
  is using CPU (--settle-ms, at most 1 s) and runs the model --warmup times
  untimed: ONNX Runtime's pool spins ~30 ms after a run returns and the
  PyTorch side's BLAS threads ~100 ms, and without the wait that spinning
  was charged to whichever side ran next (the decoder read 1.7 instead of
  1.2 ms). --dump prints every timed run.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tests", "models"))


def cpu_us(pid):
    """CPU time of every thread of a process (Linux), in microseconds."""
    total = 0
    try:
        for t in os.listdir("/proc/%d/task" % pid):
            with open("/proc/%d/task/%s/schedstat" % (pid, t)) as f:
                total += int(f.read().split()[0]) // 1000
    except OSError:
        pass
    return total


def settle(workers, limit_s):
    """Waits (up to limit_s) until no worker used more than 5% of a core over 10 ms."""
    end = time.monotonic() + limit_s
    if not os.path.isdir("/proc/self/task"):
        time.sleep(min(limit_s, 0.25))
        return
    while time.monotonic() < end:
        before = sum(cpu_us(w.p.pid) for w in workers)
        time.sleep(0.01)
        if sum(cpu_us(w.p.pid) for w in workers) - before < 500:
            return


class Worker:
    def __init__(self, name, cmd, env):
        self.name = name
        self.p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)

    def ask(self, line):
        self.p.stdin.write(line + "\n")
        self.p.stdin.flush()
        out = self.p.stdout.readline()
        if not out:
            raise RuntimeError("%s worker died" % self.name)
        r = json.loads(out)
        if "error" in r:
            raise RuntimeError("%s: %s" % (self.name, r["error"]))
        return r

    def close(self):
        try:
            self.p.stdin.write("quit\n")
            self.p.stdin.flush()
        except OSError:
            pass
        self.p.wait(timeout=30)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--ort", help="node_modules holding onnxruntime-node (ONNX Runtime side skipped without it)")
    ap.add_argument("--models", default="resnet18,mobilenet_v2,squeezenet1_1,shufflenet_v2_x0_5,encoder,decoder,resnet50")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--runs", type=int, default=6, help="timed runs per side per round")
    ap.add_argument("--warmup", type=int, default=2,
                    help="untimed runs per side before each round's timed runs: the side that ran before may "
                         "leave spinning threads or cold caches behind, and no side should pay for another")
    ap.add_argument("--settle-ms", type=float, default=1000,
                    help="at most this long before each side's runs, waiting for every worker to go idle: ONNX "
                         "Runtime's pool keeps a core spinning ~30 ms after a run returns and PyTorch's BLAS threads "
                         "~100 ms, which would be charged to the side timed next")
    ap.add_argument("--dump", action="store_true", help="print every timed run, per model and side")
    ap.add_argument("--no-torch", action="store_true")
    args = ap.parse_args()

    import models
    from compare_torch import fair_torch_env

    base_env = dict(os.environ)
    for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"):
        base_env.pop(k, None)
    bp_env = dict(base_env, PYTHONPATH=os.path.join(os.path.abspath(args.build), "python"),
                  BACKPLANE_NUM_THREADS=str(args.threads))
    workers = [Worker("backplane", [sys.executable, os.path.join(HERE, "model_worker.py"), "--side", "backplane",
                                    "--threads", str(args.threads)], bp_env)]
    if args.ort:
        workers.append(Worker("onnxruntime", ["node", os.path.join(HERE, "ort_worker.js")],
                              dict(base_env, NODE_PATH=os.path.abspath(args.ort), ORT_THREADS=str(args.threads))))
    else:
        print("ONNX Runtime side skipped (no --ort)")
    if not args.no_torch:
        torch_env, notes = fair_torch_env(False)
        for n in notes:
            print(n)
        workers.append(Worker("pytorch", [sys.executable, os.path.join(HERE, "model_worker.py"), "--side", "torch",
                                          "--threads", str(args.threads)], torch_env))
    print("load average: %.2f %.2f %.2f" % os.getloadavg())
    names = [m for m in args.models.split(",") if m]
    times = {(m, w.name): [] for m in names for w in workers}
    with tempfile.TemporaryDirectory() as tmp:
        for m in names:
            path = os.path.join(tmp, m + ".onnx")
            _, inputs, _ = models.export(m, path)
            x = inputs[0]
            dtype = "int64" if str(x.dtype) == "torch.int64" else "float32"
            for w in workers:
                if w.name == "onnxruntime":
                    w.ask("load %s %s input %s %s" % (m, path, dtype, ",".join(str(d) for d in x.shape)))
                else:
                    w.ask("load %s %s %s" % (m, path, args.device))
        for r in range(args.rounds):
            for m in names:
                order = workers[r % len(workers):] + workers[:r % len(workers)]
                for w in order:
                    settle(workers, args.settle_ms / 1e3)
                    if args.warmup:
                        w.ask("time %s %d" % (m, args.warmup))
                    times[(m, w.name)] += w.ask("time %s %d" % (m, args.runs))["times"]
    if args.dump:
        for k, v in times.items():
            print(k, " ".join("%.2f" % t for t in v))
    for w in workers:
        w.close()
    print("load average after: %.2f %.2f %.2f" % os.getloadavg())
    cols = [w.name for w in workers]
    print("\nbatch 1, %d threads, device %s, median of %d runs (%d alternating rounds)" %
          (args.threads, args.device, args.rounds * args.runs, args.rounds))
    head = "%-20s" % "model" + "".join("%14s" % (c + " ms") for c in cols) + "".join(
        "%16s" % (c + "/ours") for c in cols[1:])
    print(head)
    for m in names:
        med = [statistics.median(times[(m, c)]) for c in cols]
        print("%-20s" % m + "".join("%14.2f" % t for t in med) + "".join("%16.2f" % (t / med[0]) for t in med[1:]))


if __name__ == "__main__":
    main()

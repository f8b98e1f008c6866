"""python3 -m backplane devices|run|conformance: the `backplane` command's
subcommands from Python (devices and run here; conformance runs the
installed `backplane` program, which it needs)."""

import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys

import backplane


def cmd_devices(args):
    rows = backplane.devices(load=True)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    for d in rows:
        state = d["state"] + (": " + d["rejection"] if d["rejection"] else "")
        print(f"{d['name']:<12} {d['kind']:<12} {d['plugin']:<10} {state:<12} {d['description']}")
    return 0


def cmd_run(args):
    graph, inputs = backplane.load_graph(args.graph)
    plan = backplane.compile(graph, device=args.device, profile=args.profile)
    if args.explain:
        print(plan.explain(), end="")
    import numpy as np  # run only: `devices` and `conformance` need no NumPy

    out = plan(**inputs)
    if args.out:
        folder = pathlib.Path(args.out)
        folder.mkdir(parents=True, exist_ok=True)
        for name, value in out.items():
            # The files `backplane run` writes: NumPy has no bf16, so a bf16
            # output is saved as its bit patterns (<u2), not widened values.
            # The float32 values came from bf16 exactly: the top half is it.
            if plan.output_dtype(name) == "bf16":
                value = (np.ascontiguousarray(value, np.float32).view(np.uint32) >> 16).astype("<u2")
            np.save(folder / f"{name}.npy", value)
    else:
        for name, value in out.items():
            print(f"{name}: {value.dtype}{list(value.shape)}")
            print(value)
    if args.profile:
        print(plan.profile_table(), end="")
    return 0


def find_program():
    # The build tree (build/python/backplane -> build/bin), an install
    # (PREFIX/lib/python3*/dist-packages/backplane -> PREFIX/bin), then PATH.
    here = pathlib.Path(backplane.__file__).resolve().parent
    candidates = [here.parent.parent / "bin" / "backplane"]
    if len(here.parents) > 3:
        candidates.append(here.parents[3] / "bin" / "backplane")
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return shutil.which("backplane")


def cmd_conformance(rest):
    program = find_program()
    if not program:
        print("python3 -m backplane conformance: the `backplane` program was not found", file=sys.stderr)
        return 2
    return subprocess.call([program, "conformance", *rest])


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "conformance":
        return cmd_conformance(argv[1:])
    parser = argparse.ArgumentParser(prog="python3 -m backplane")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("devices", help="manifests found, devices, load status")
    p.add_argument("--json", action="store_true")
    p = sub.add_parser("run", help="run a graph file")
    p.add_argument("graph")
    p.add_argument("--device", default="auto")
    p.add_argument("--out")
    p.add_argument("--explain", action="store_true")
    p.add_argument("--profile", action="store_true")
    sub.add_parser("conformance", help="the conformance suite (the `backplane` program's)")
    args = parser.parse_args(argv)
    try:
        return cmd_devices(args) if args.command == "devices" else cmd_run(args)
    except backplane.Error as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

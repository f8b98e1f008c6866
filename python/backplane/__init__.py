"""Backplane from Python: devices, graphs, plans, device tensors and DLPack.

    import numpy as np, backplane
    g = backplane.Graph()
    g.input("x", "f32", [2, 3])
    g.node("y", "relu", ["x"])
    g.output("y")
    plan = backplane.compile(g, device="auto")
    out = plan(x=np.ones((2, 3), np.float32))["y"]

A plan takes NumPy arrays (copied in; large C-contiguous ones of the right
dtype are read in place on the cpu) or backplane.Tensor objects (used in
place on their device). Tensor implements __dlpack__/__dlpack_device__, and
backplane.from_dlpack imports any DLPack producer's host memory without a
copy. Errors are backplane.Error, carrying the core's message, `.code` (the
bp_status_code number) and `.status` (its name). See docs/host-guide.md.
"""

from ._backplane import (  # noqa: F401
    STATUS_CODES,
    Completion,
    Device,
    Error,
    Graph,
    Plan,
    Runtime,
    Tensor,
    _load_graph,
)

from . import onnx  # noqa: E402,F401  (backplane.onnx.load)
from .torch_import import from_torch  # noqa: E402,F401

__all__ = [
    "Completion", "Device", "Error", "Graph", "Plan", "Runtime", "Tensor", "STATUS_CODES",
    "compile", "devices", "from_dlpack", "from_torch", "load_graph", "onnx", "runtime", "upload",
]

_runtime = None


def runtime():
    """The process's default Runtime (created on first use)."""
    global _runtime
    if _runtime is None:
        _runtime = Runtime()
    return _runtime


def devices(load=True):
    """Every device (and unloaded or rejected plugin) as dicts."""
    return runtime().devices(load)


def load_graph(path):
    """A graph file: (Graph, {input name: NumPy array}) for its .npy inputs."""
    return _load_graph(str(path))


def compile(graph, device="auto", keep=(), profile=False, optimize=True, memory_baseline=False, dims=None):  # noqa: A001
    """Compiles `graph` for a device or an ordered list ("vulkan0,cpu").
    optimize=False runs the graph node for node (no fused vendor ops
    substituted; see plan.explain()). memory_baseline=True also sizes the
    unoptimized graph's buffers (plan.compile_stats()). dims: the first
    sizes of the graph's dynamic dims ({"seq": 8}; 1 for any not named);
    inputs of other sizes, or plan.set_dims, move the plan to them."""
    return runtime().compile(graph, device, list(keep), profile, True, optimize, memory_baseline, dict(dims or {}))


def upload(array, device="auto", dtype=None):
    """Copies a NumPy array into a new Tensor on `device` (`dtype` converts
    first; "bf16" rounds float values to nearest even)."""
    return runtime().upload(array, device, dtype)


def from_dlpack(obj, device=None):
    """A Tensor over the memory of a DLPack producer (NumPy, PyTorch, a
    capsule): host memory is used in place, strides honoured."""
    return runtime().from_dlpack(obj, device)

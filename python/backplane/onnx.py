"""ONNX models in: backplane.onnx.load(path) gives a Graph.

    import numpy as np, backplane
    g = backplane.onnx.load("resnet18.onnx", shapes={"input": [1, 3, 224, 224]})
    plan = backplane.compile(g, device="vulkan0,cpu")
    logits = plan(input=x)[g.outputs[0]]

Shapes are static after import: a dynamic dim of the model ("batch",
"sequence") takes its size from `shapes` (by input name) or `dims` (by dim
name). Errors are backplane.Error naming the model and the node; a model with
ops Backplane cannot express lists every such op. See docs/onnx.md.
"""

from . import _backplane


class Model:
    """An imported model: `graph`, its `inputs` and `outputs` (graph names,
    the model's own unless those had characters a file name cannot hold),
    `onnx_names` (graph name -> ONNX name) and `notes` (what the import did)."""

    def __init__(self, graph, inputs, outputs, onnx_names, notes):
        self.graph = graph
        self.inputs = list(inputs)
        self.outputs = list(outputs)
        self.onnx_names = dict(onnx_names)
        self.notes = list(notes)

    def __repr__(self):
        return "<backplane.onnx.Model inputs=%s outputs=%s>" % (self.inputs, self.outputs)


def _require():
    if not _backplane._HAVE_ONNX:
        raise _backplane.Error("this build of backplane has no ONNX importer (install libonnx-dev and rebuild)")


def _shapes(shapes):
    return {str(k): [int(d) for d in v] for k, v in (shapes or {}).items()}


def _dims(dims):
    return {str(k): int(v) for k, v in (dims or {}).items()}


def load_model(path_or_bytes, shapes=None, dims=None, label="model"):
    """Imports an ONNX file (a path) or a serialized model (bytes) as a Model."""
    _require()
    if isinstance(path_or_bytes, (bytes, bytearray)):
        r = _backplane._onnx_import_bytes(bytes(path_or_bytes), _shapes(shapes), _dims(dims), label)
    else:
        r = _backplane._onnx_import_file(str(path_or_bytes), _shapes(shapes), _dims(dims))
    return Model(*r)


def load(path_or_bytes, shapes=None, dims=None):
    """Imports an ONNX file (or serialized model bytes) and returns its Graph."""
    return load_model(path_or_bytes, shapes, dims).graph

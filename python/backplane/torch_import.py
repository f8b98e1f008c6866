"""PyTorch modules in: backplane.from_torch(module, *example_inputs).

The module is exported to ONNX in memory (torch.onnx.export, constant
folding on, eval mode) and imported as any ONNX model; nothing touches the
disk. With check=True the graph is compiled on `device`, run on the example
inputs and compared with the module's own outputs (docs/ops.md tolerances
for f32 reductions, scaled by the outputs' magnitude); a mismatch raises
backplane.Error naming the output and the largest error.
"""

import io

from . import _backplane
from . import onnx as _onnx


def _flat_outputs(out):
    if isinstance(out, (tuple, list)):
        r = []
        for o in out:
            r.extend(_flat_outputs(o))
        return r
    if isinstance(out, dict):
        r = []
        for k in sorted(out):
            r.extend(_flat_outputs(out[k]))
        return r
    return [out]


def from_torch(module, *example_inputs, device="cpu", check=True, opset=13, rtol=1e-3, atol=1e-4,
               input_names=None, output_names=None):
    """A Graph for `module` at the example inputs' shapes. Inputs are named
    `input_names` (default: input0, input1, ...), outputs `output_names`
    (default: output0, ...). With check=True, runs both and compares."""
    import torch

    import numpy as np  # here, not at import: `python3 -m backplane devices` needs no NumPy

    if not example_inputs:
        raise _backplane.Error("from_torch needs at least one example input")
    module = module.eval()
    n_in = len(example_inputs)
    input_names = list(input_names or ["input%d" % i for i in range(n_in)])
    with torch.no_grad():
        expected = [o.detach().cpu().numpy() for o in _flat_outputs(module(*example_inputs))]
    output_names = list(output_names or ["output%d" % i for i in range(len(expected))])
    buf = io.BytesIO()
    with torch.no_grad():
        torch.onnx.export(module, tuple(example_inputs), buf, opset_version=opset, do_constant_folding=True,
                          input_names=input_names, output_names=output_names)
    model = _onnx.load_model(buf.getvalue(), label="from_torch(%s)" % type(module).__name__)
    if check:
        from . import compile as _compile
        plan = _compile(model.graph, device=device)
        feeds = {name: np.ascontiguousarray(x.detach().cpu().numpy())
                 for name, x in zip(model.inputs, example_inputs)}
        got = plan(**feeds)
        for name, want in zip(model.outputs, expected):
            have = np.asarray(got[name], dtype=np.float64)
            want = np.asarray(want, dtype=np.float64)
            if have.shape != want.shape:
                raise _backplane.Error("from_torch check: output '%s' has shape %s, the module's %s"
                                       % (name, have.shape, want.shape))
            scale = max(1.0, float(np.max(np.abs(want)))) if want.size else 1.0
            err = np.abs(have - want)
            bad = err > atol * scale + rtol * np.abs(want)
            if np.any(bad) or np.any(np.isnan(have) != np.isnan(want)):
                i = int(np.argmax(err))
                raise _backplane.Error("from_torch check on %s: output '%s' differs from the module: max error %.3g at "
                                       "flat index %d (%.6g vs %.6g)" % (device, name, float(err.flat[i]), i,
                                                                         have.flat[i], want.flat[i]))
    return model.graph

"""backplane.onnx and backplane.from_torch against PyTorch and NumPy."""
import numpy as np
import pytest

import backplane

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not backplane._backplane._HAVE_ONNX, reason="built without the ONNX importer")


class Small(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc1 = torch.nn.Linear(8, 16)
        self.fc2 = torch.nn.Linear(16, 4)

    def forward(self, x):
        h = torch.nn.functional.gelu(self.fc1(x))
        return torch.softmax(self.fc2(torch.nn.functional.layer_norm(h, (16,))), dim=-1)


def test_from_torch_matches_the_module():
    m = Small().eval()
    x = torch.rand(3, 8) * 2 - 1
    g = backplane.from_torch(m, x, device="cpu", check=True)
    assert g.inputs == ["input0"] and g.outputs == ["output0"]
    got = backplane.compile(g, device="cpu")(input0=x.numpy())["output0"]
    with torch.no_grad():
        want = m(x).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)


def test_compositions_become_single_ops():
    # Exported at opset 13, LayerNorm and GELU are 9 and 5 ONNX nodes; the
    # import keeps them as exported and the optimizer maps them back at
    # compile (explain says so); the values match PyTorch either way.
    import io
    m = Small().eval()
    x = torch.rand(3, 8)
    buf = io.BytesIO()
    torch.onnx.export(m, (x,), buf, opset_version=13, input_names=["x"], output_names=["y"])
    model = backplane.onnx.load_model(buf.getvalue())
    assert "mapped onto" not in " ".join(model.notes)
    plan = backplane.compile(model.graph, device="cpu")
    explain = plan.explain()
    assert "1 exported LayerNorm chain (mean, sub, sqr, mean, add, sqrt, div[, mul, add]) run as layer_norm" in explain
    assert "1 exported GELU chain (div by √2, erf, add 1, mul, mul by 0.5) run as gelu" in explain
    plain = backplane.compile(model.graph, device="cpu", optimize=False)
    assert "run as layer_norm" not in plain.explain()
    with torch.no_grad():
        want = m(x).numpy()
    for p in (plan, plain):
        np.testing.assert_allclose(p(x=x.numpy())["y"], want, rtol=1e-4, atol=1e-6)


def test_bad_models_are_errors_naming_the_model():
    with pytest.raises(backplane.Error, match="junk: not an ONNX model"):
        backplane.onnx.load_model(b"\x08\x01garbage", label="junk")
    with pytest.raises(backplane.Error, match="no such file"):
        backplane.onnx.load("/nonexistent.onnx")

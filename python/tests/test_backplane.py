"""The Python package against NumPy's answers (run by ctest: python_package)."""

import gc
import json
import os
import pathlib
import subprocess
import sys
import threading

import numpy as np
import pytest

import backplane


@pytest.fixture(scope="module")
def rt():
    return backplane.Runtime(use_environment=False)


def device_names(runtime):
    return [d["name"] for d in runtime.devices() if d["state"] == "loaded" and d["plugin"] in ("cpu", "vulkan")]


def unary(op, shape, dtype="f32"):
    g = backplane.Graph()
    g.input("x", dtype, list(shape))
    g.node("y", op, ["x"])
    g.output("y")
    return g


def affine(shape):
    g = backplane.Graph()
    for name in ("x", "w", "b"):
        g.input(name, "f32", list(shape))
    g.node("t", "mul", ["x", "w"])
    g.node("y", "add", ["t", "b"])
    g.output("y")
    return g


def test_devices_lists_cpu(rt):
    rows = rt.devices()
    assert any(r["name"] == "cpu" and r["state"] == "loaded" for r in rows)
    assert backplane.devices()  # the default runtime


def test_numpy_round_trip_on_every_device(rt):
    x = np.random.default_rng(1).standard_normal((3, 5)).astype(np.float32)
    w = np.random.default_rng(2).standard_normal((3, 5)).astype(np.float32)
    b = np.random.default_rng(3).standard_normal((3, 5)).astype(np.float32)
    names = device_names(rt)
    assert "cpu" in names
    for dev in names:
        plan = rt.compile(affine(x.shape), dev)
        assert plan.input_names == ["x", "w", "b"] and plan.output_names == ["y"]
        out = plan(x=x, w=w, b=b)
        assert set(out) == {"y"}
        np.testing.assert_allclose(out["y"], x * w + b, rtol=1e-6, atol=1e-6, err_msg=dev)
        # Device tensors: weights uploaded once, the output kept on the device.
        plan.set_input("w", rt.upload(w, dev))
        plan.set_input("b", rt.upload(b, dev))
        for k in range(3):
            plan.set_input("x", x + k)
            plan.execute()
            np.testing.assert_allclose(plan.output("y"), (x + k) * w + b, rtol=1e-6, atol=1e-6)
        y = plan.output_tensor("y")
        assert y.device.name == dev and y.shape == (3, 5) and y.dtype == "f32"
        neg = rt.compile(unary("neg", x.shape), dev)
        neg.set_input("x", y)
        assert any("read in place (no copy)" in line for line in neg.describe())
        neg.execute()
        np.testing.assert_allclose(neg.output("y"), -((x + 2) * w + b), rtol=1e-6, atol=1e-6)


def test_dtypes_round_trip(rt):
    for np_type, bp_type in ((np.float64, "f64"), (np.int32, "i32"), (np.int64, "i64"), (np.int8, "i8"), (np.uint8, "u8")):
        x = (np.arange(12) % 7 - (3 if bp_type != "u8" else 0)).astype(np_type).reshape(3, 4)
        out = rt.compile(unary("abs", x.shape, bp_type), "cpu")(x=x)["y"]
        assert out.dtype == np_type
        np.testing.assert_array_equal(out, np.abs(x))


def bf16_round(a):
    """Round float32 values to bf16 (nearest even) and back, by hand."""
    u = np.asarray(a, np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16 << 16
    return u.astype(np.uint32).view(np.float32)


def test_bf16_values_cross_as_float32(rt):
    # 1 + 2^-8 is halfway between two bf16 values: rounds to even (1.0);
    # 1 + 3*2^-8 rounds up to 1 + 2^-6.
    x = np.array([[1.0, 1 + 2**-8, 1 + 3 * 2**-8, -2.5], [0.0, 1e30, -np.inf, 3.0]], np.float32)
    want = bf16_round(x)
    np.testing.assert_array_equal(want[0, :3], np.array([1.0, 1.0, 1 + 2**-6], np.float32))
    for dev in device_names(rt):
        g = unary("neg", x.shape, "bf16")
        try:
            plan = rt.compile(g, dev)
        except backplane.Error as e:
            assert e.status == "UNIMPLEMENTED", e
            continue
        out = plan(x=x)["y"]
        assert out.dtype == np.float32
        np.testing.assert_array_equal(out, -want)
        t = plan.output_tensor("y")
        assert t.dtype == "bf16"
        np.testing.assert_array_equal(t.numpy(), -want)
    up = rt.upload(x, "cpu", dtype="bf16")
    assert up.dtype == "bf16" and up.nbytes == x.size * 2
    np.testing.assert_array_equal(up.numpy(), want)


def test_constant_converted_to_bf16(rt):
    # Graph.constant(dtype="bf16") rounds f32 values to nearest even, as
    # upload does: 1 + 2^-8 is a tie (to 1), 1 + 3 * 2^-8 rounds up to
    # 1 + 2^-6; a truncating conversion would give 1 + 2^-7 for the second.
    g = backplane.Graph()
    g.input("x", "f32", [3])
    g.constant("c", np.array([1 + 2**-8, 1 + 3 * 2**-8, -2.5], np.float32), dtype="bf16")
    g.node("cf", "cast", ["c"], {"dtype": "f32"})
    g.node("y", "add", ["x", "cf"])
    g.output("y")
    y = rt.compile(g, "cpu")(x=np.zeros(3, np.float32))["y"]
    np.testing.assert_array_equal(y, [1.0, 1 + 2**-6, -2.5])
    with pytest.raises(backplane.Error, match="constant 'd': values from 0 to 300 do not fit u8"):
        g.constant("d", np.array([0, 300]), dtype="u8")


def test_bf16_with_torch_through_dlpack(rt):
    torch = pytest.importorskip("torch", reason="python3-torch is not installed")
    x = torch.tensor([[1.5, -2.0, 3.25], [0.0, 7.0, -0.5]], dtype=torch.bfloat16)
    t = backplane.from_dlpack(x)
    assert t.dtype == "bf16" and t.data_ptr == x.data_ptr()
    plan = rt.compile(unary("neg", (2, 3), "bf16"), "cpu")
    plan.set_input("x", t)
    plan.execute()
    y = torch.from_dlpack(plan.output_tensor("y"))
    assert y.dtype == torch.bfloat16
    assert torch.equal(y, -x)


def test_large_inputs_read_in_place_and_bound_outputs_written_in_place(rt):
    n = 1 << 16  # 256 KiB: read in place
    x = np.arange(n, dtype=np.float32)
    plan = rt.compile(unary("neg", (n,)), "cpu")
    plan.set_input("x", x)
    assert any("read in place (no copy)" in line for line in plan.describe())
    out = np.empty(n, np.float32)
    plan.bind_output("y", out)
    plan.execute()
    np.testing.assert_array_equal(out, -x)
    # Addresses: the output tensor is the application's array.
    assert plan.output_tensor("y").data_ptr == out.ctypes.data
    x[7] = 1000  # the plan reads the application's memory in place
    plan.execute()
    assert out[7] == -1000
    plan.bind_output("y", None)
    # Small arrays are copied (cheaper), and described so.
    small = rt.compile(unary("neg", (4,)), "cpu")
    small.set_input("x", np.ones(4, np.float32))
    assert any("host data copied in" in line for line in small.describe())


def test_large_inputs_in_place_on_every_device_that_imports(rt):
    n = 1 << 16
    for dev in device_names(rt):
        if not rt.device(dev).imports_host_memory:
            continue
        x = np.arange(n, dtype=np.float32)
        plan = rt.compile(unary("neg", (n,)), dev)
        plan.set_input("x", x)
        assert any("read in place (no copy)" in line for line in plan.describe()), (dev, plan.describe())
        plan.execute()
        np.testing.assert_array_equal(plan.output("y"), -x)
        x[7] = 1000  # the device reads the application's memory in place
        plan.execute()
        assert plan.output("y")[7] == -1000, dev


def test_dlpack_with_numpy_zero_copy(rt):
    a = np.arange(24, dtype=np.float32).reshape(4, 6)
    t = backplane.from_dlpack(a)
    assert t.data_ptr == a.ctypes.data
    assert t.shape == (4, 6)
    back = np.from_dlpack(t)
    assert back.ctypes.data == a.ctypes.data
    np.testing.assert_array_equal(back, a)
    # Strides honoured: a transposed view.
    v = a.T
    tv = backplane.from_dlpack(v)
    assert tv.shape == (6, 4) and tv.strides == (1, 6) and not tv.is_contiguous()
    np.testing.assert_array_equal(tv.numpy(), v)
    np.testing.assert_array_equal(np.from_dlpack(tv), v)
    # The array API's newer keywords (a NumPy 2 consumer passes max_version).
    cap = t.__dlpack__(max_version=(1, 0), dl_device=(1, 0), copy=False)
    assert type(cap).__name__ == "PyCapsule"
    with pytest.raises(backplane.Error, match="kDLCPU"):
        t.__dlpack__(dl_device=(2, 0))
    with pytest.raises(backplane.Error, match="copy=True"):
        t.__dlpack__(copy=True)
    # A backplane output to NumPy without a copy.
    plan = rt.compile(unary("exp", (8,)), "cpu")
    plan(x=np.zeros(8, np.float32))
    y = plan.output_tensor("y")
    ny = np.from_dlpack(y)
    assert ny.ctypes.data == y.data_ptr
    np.testing.assert_array_equal(ny, np.ones(8, np.float32))
    # The producer outlives every Python reference but the Tensor's.
    big = np.full(1000, 3.0, np.float32)
    ptr = big.ctypes.data
    held = backplane.from_dlpack(big)
    del big
    gc.collect()
    assert held.data_ptr == ptr
    np.testing.assert_array_equal(held.numpy(), np.full(1000, 3.0, np.float32))


def test_dlpack_with_torch(rt):
    torch = pytest.importorskip("torch", reason="python3-torch is not installed")
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    t = backplane.from_dlpack(x)
    assert t.data_ptr == x.data_ptr()
    np.testing.assert_array_equal(t.numpy(), x.numpy())
    # Backplane -> torch, in place.
    plan = rt.compile(unary("relu", (3, 4)), "cpu")
    plan(x=np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4))
    y = plan.output_tensor("y")
    ty = torch.from_dlpack(y)
    assert ty.data_ptr() == y.data_ptr
    np.testing.assert_allclose(ty.numpy(), np.maximum(np.linspace(-1, 1, 12, dtype=np.float32), 0).reshape(3, 4))
    # A strided torch view.
    v = x.t()
    tv = backplane.from_dlpack(v)
    assert tv.strides == (1, 4)
    np.testing.assert_array_equal(tv.numpy(), v.numpy())
    # torch's view fed to a plan (copied: not dense) gives the right answer.
    p2 = rt.compile(unary("neg", (4, 3)), "cpu")
    p2.set_input("x", tv)
    p2.execute()
    np.testing.assert_array_equal(p2.output("y"), -v.numpy())


def test_errors_are_exceptions_with_codes(rt):
    plan = rt.compile(unary("neg", (4,)), "cpu")
    with pytest.raises(backplane.Error, match=r"input 'x': expected f32\[4\], got f32\[3\]") as e:
        plan(x=np.ones(3, np.float32))
    assert e.value.code == backplane.STATUS_CODES["INVALID_ARGUMENT"] and e.value.status == "INVALID_ARGUMENT"
    with pytest.raises(backplane.Error, match="input 'x' was never set"):
        rt.compile(unary("neg", (4,)), "cpu").execute()
    with pytest.raises(backplane.Error, match="'nope'"):
        plan.set_input("nope", np.ones(4, np.float32))
    with pytest.raises(backplane.Error, match="no device matches|unknown device|no such device|'warp9'"):
        rt.compile(unary("neg", (4,)), "warp9")
    g = backplane.Graph()
    g.input("x", "f32", [2, 3])
    g.input("w", "f32", [4, 5])
    g.node("y", "matmul", ["x", "w"])
    g.output("y")
    with pytest.raises(backplane.Error, match="node 'y' \\(matmul\\)"):
        rt.compile(g, "cpu")
    with pytest.raises(backplane.Error, match="not aligned"):
        plan.bind_output("y", np.zeros(17, np.uint8)[1:].view(np.float32))
    with pytest.raises(backplane.Error, match="expected f32\\[4\\], got f64\\[4\\]"):
        plan.bind_output("y", np.zeros(4, np.float64))
    with pytest.raises(backplane.Error, match="expected an object with __dlpack__"):
        backplane.from_dlpack(42)
    # A vulkan0 tensor in host-visible memory (lavapipe, integrated GPUs)
    # exports through DLPack with its values; one in device-only memory (a
    # discrete GPU) is refused as UNIMPLEMENTED: the served device below
    # shows that refusal on every machine.
    if "vulkan0" in device_names(rt):
        vk = rt.upload(np.array([1.5, -2, 0, 7], np.float32), "vulkan0")
        if vk.data_ptr == 0:
            with pytest.raises(backplane.Error) as e:
                vk.__dlpack__()
            assert e.value.status == "UNIMPLEMENTED"
        else:
            np.testing.assert_array_equal(np.from_dlpack(vk), [1.5, -2, 0, 7])
    assert issubclass(backplane.Error, RuntimeError)


def test_dlpack_refuses_a_tensor_without_host_memory(tmp_path, monkeypatch):
    # A served device's buffers live in the server: the tensor has no host
    # pointer, and __dlpack__ must refuse with UNIMPLEMENTED rather than hand
    # out a null or stale pointer (would catch an export of data_ptr 0).
    from backplane.__main__ import find_program
    program = find_program()
    if not program:
        pytest.skip("the backplane program is not next to the package")
    token, sock = tmp_path / "token", tmp_path / "bp.sock"
    token.write_bytes(os.urandom(24).hex().encode())
    token.chmod(0o600)
    env = dict(os.environ, BACKPLANE_PLUGIN_PATH="")
    server = subprocess.Popen([program, "serve", "--unix", str(sock), "--token-file", str(token), "--plugin", "cpu"],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        line = server.stdout.readline()  # "backplane serve: listening on ..." or why not
        if "listening" not in line:
            server.kill()
            if "remote" in line and "not built" in line:
                pytest.skip(line.strip())
            pytest.fail("backplane serve did not start: " + line + server.stdout.read())
        monkeypatch.setenv("BACKPLANE_REMOTE", f"unix:{sock}")
        monkeypatch.setenv("BACKPLANE_REMOTE_TOKEN_FILE", str(token))
        remote = backplane.Runtime()
        name = f"cpu@unix:{sock}"
        t = remote.upload(np.array([1.5, -2, 0, 7], np.float32), name)
        assert t.data_ptr == 0
        with pytest.raises(backplane.Error) as e:
            t.__dlpack__()
        assert e.value.status == "UNIMPLEMENTED"
        np.testing.assert_array_equal(t.numpy(), [1.5, -2, 0, 7])
        del t, remote
        gc.collect()
    finally:
        server.terminate()
        server.wait(timeout=20)


def test_submit_and_wait_on_every_device(rt):
    x = np.arange(4096, dtype=np.float32)
    plans = [rt.compile(unary("neg", x.shape), d) for d in device_names(rt)]
    runs = [p.submit(x=x) for p in plans]  # all in flight at once
    for r in runs:
        np.testing.assert_array_equal(r.wait()["y"], -x)
        assert r.poll() and r.error() is None
    g = backplane.Graph()
    g.input("x", "f32", [4])
    g.input("i", "i64", [2])
    g.node("picked", "gather", ["x", "i"], {"dim": 0})
    g.output("picked")
    bad = rt.compile(g, "cpu").submit(x=np.ones(4, np.float32), i=np.array([0, 9]))
    with pytest.raises(backplane.Error, match="node 'picked' \\(gather\\)"):
        bad.wait()
    assert isinstance(bad.error(), backplane.Error)


def test_plans_from_several_threads(rt):
    plan = rt.compile(unary("neg", (1000,)), "cpu")
    errors = []

    def work(k):
        try:
            for _ in range(20):
                x = np.full(1000, float(k), np.float32)
                np.testing.assert_array_equal(plan(x=x)["y"], -x)
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_profile(rt):
    feeds = dict(x=np.ones(8, np.float32), w=np.ones(8, np.float32), b=np.ones(8, np.float32))
    plan = rt.compile(affine((8,)), "cpu", profile=True, optimize=False)
    plan(**feeds)
    prof = plan.profile()
    assert [s["op"] for s in prof["steps"] if s["kind"] == "kernel"] == ["mul", "add"]
    assert "total" in plan.profile_table()
    # Optimized, the CPU runs the chain as one fused kernel.
    fused = rt.compile(affine((8,)), "cpu", profile=True)
    fused(**feeds)
    assert [s["op"] for s in fused.profile()["steps"] if s["kind"] == "kernel"] == ["fused_elementwise"]


@pytest.mark.parametrize("prepare", [True, False])
def test_compile_prepare_either_way(rt, prepare):
    # prepare=True (the default) sets devices up while compiling; the values
    # are the same either way, on every device.
    x = np.arange(8, dtype=np.float32) - 3.5
    w = np.full(8, 0.5, np.float32)
    b = np.full(8, 2.0, np.float32)
    for dev in device_names(rt):
        plan = rt.compile(affine((8,)), dev, prepare=prepare)
        for _ in range(2):
            out = plan(x=x, w=w, b=b)
            np.testing.assert_array_equal(out["y"], x * 0.5 + 2.0)


def test_graph_files_and_module_cli(tmp_path):
    np.save(tmp_path / "x.npy", np.array([-1.0, 2.0, -3.0], np.float32))
    (tmp_path / "g.json").write_text(json.dumps({
        "inputs": {"x": "x.npy", "k": {"value": [2, 2, 2], "dtype": "f32"}},
        "nodes": [{"name": "y", "op": "mul", "inputs": ["x", "k"]}, {"name": "z", "op": "relu", "inputs": ["y"]}],
        "outputs": ["z"],
    }))
    graph, inputs = backplane.load_graph(tmp_path / "g.json")
    assert list(inputs) == ["x"]
    np.testing.assert_array_equal(backplane.compile(graph, "cpu")(**inputs)["z"], [0, 4, 0])
    env = dict(os.environ)
    r = subprocess.run([sys.executable, "-m", "backplane", "run", str(tmp_path / "g.json"), "--device", "cpu",
                        "--out", str(tmp_path / "out")], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "out" / "z.npy"), [0, 4, 0])
    r = subprocess.run([sys.executable, "-m", "backplane", "devices", "--json"], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert any(d["name"] == "cpu" for d in json.loads(r.stdout))
    r = subprocess.run([sys.executable, "-m", "backplane", "run", str(tmp_path / "missing.json")], env=env,
                       capture_output=True, text=True)
    assert r.returncode == 1 and "missing.json" in r.stderr


def test_module_cli_run_writes_the_files_backplane_run_writes(tmp_path):
    # bf16 outputs: `backplane run` saves their bit patterns (<u2); the
    # module once saved float32 values, so the two disagreed on such graphs.
    from backplane.__main__ import find_program
    program = find_program()
    if not program:
        pytest.skip("the backplane program is not next to the package")
    (tmp_path / "g.json").write_text(json.dumps({
        "inputs": {"x": {"value": [1.5, -2.25, 3.0078125, 1e-3], "dtype": "f32"}},
        "nodes": [{"name": "h", "op": "cast", "inputs": ["x"], "params": {"dtype": "bf16"}},
                  {"name": "y", "op": "neg", "inputs": ["h"]},
                  {"name": "z", "op": "relu", "inputs": ["x"]}],
        "outputs": ["y", "z"],
    }))
    r = subprocess.run([sys.executable, "-m", "backplane", "run", str(tmp_path / "g.json"), "--device", "cpu",
                        "--out", str(tmp_path / "py")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([program, "run", str(tmp_path / "g.json"), "--device", "cpu", "--out", str(tmp_path / "cli")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    for name in ("y", "z"):
        assert (tmp_path / "py" / f"{name}.npy").read_bytes() == (tmp_path / "cli" / f"{name}.npy").read_bytes(), name
    y = np.load(tmp_path / "py" / "y.npy")
    assert y.dtype == np.dtype("<u2")
    # -1.5 is 0xBFC0 in bf16; 3.0078125 rounds to 3.0 (0x4040), negated 0xC040.
    assert y[0] == 0xBFC0 and y[2] == 0xC040


def test_module_cli_conformance():
    r = subprocess.run([sys.executable, "-m", "backplane", "conformance", "--plugin", "cpu", "--quick", "--quiet",
                        "--compare", "none", "--filter", "add"], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "conformance: passed" in r.stdout


def test_cli_run_profile(tmp_path):
    from backplane.__main__ import find_program
    program = find_program()
    if not program:
        pytest.skip("the backplane program is not next to the package")
    np.save(tmp_path / "x.npy", np.ones((8, 16), np.float32))
    (tmp_path / "g.json").write_text(json.dumps({
        "inputs": {"x": "x.npy", "w": {"value": [[1.0] * 4] * 16, "dtype": "f32"}},
        "nodes": [{"name": "m", "op": "matmul", "inputs": ["x", "w"]}, {"name": "r", "op": "relu", "inputs": ["m"]}],
        "outputs": ["r"],
    }))
    r = subprocess.run([program, "run", str(tmp_path / "g.json"), "--device", "cpu", "--profile", "--json"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    prof = json.loads(r.stdout)["profile"]
    assert [(s["node"], s["op"]) for s in prof["steps"] if s["kind"] == "kernel"] == [("m", "matmul"), ("r", "relu")]
    r = subprocess.run([program, "run", str(tmp_path / "g.json"), "--device", "cpu", "--profile"],
                       capture_output=True, text=True)
    assert r.returncode == 0 and "node 'm' (matmul)" in r.stdout and "total" in r.stdout


def test_optimize_fuses_conv_relu_and_can_be_turned_off(rt):
    # conv2d -> relu runs as the CPU plugin's cpu.conv2d_relu (its manifest's
    # decomposition is the pattern); optimize=False keeps the two nodes. Both
    # match NumPy's conv + relu.
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 3, 6, 6)).astype(np.float32)
    w = (rng.standard_normal((4, 3, 3, 3)) * 0.5).astype(np.float32)
    b = rng.standard_normal(4).astype(np.float32)
    g = backplane.Graph()
    g.input("x", "f32", [1, 3, 6, 6])
    g.constant("w", w)
    g.constant("b", b)
    g.node("c", "conv2d", ["x", "w", "b"], {"padding": 1})
    g.node("y", "relu", ["c"])
    g.output("y")
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    want = np.zeros((1, 4, 6, 6))
    for i in range(6):
        for j in range(6):
            want[0, :, i, j] = np.tensordot(w.astype(np.float64), xp[0, :, i:i + 3, j:j + 3], axes=3) + b
    want = np.maximum(want, 0)
    fused = rt.compile(g, "cpu")
    plain = rt.compile(g, "cpu", optimize=False)
    assert "replaced by cpu.conv2d_relu" in fused.explain()
    assert "cpu.conv2d_relu" not in plain.explain()
    for plan in (fused, plain):
        np.testing.assert_allclose(plan(x=x)["y"], want, rtol=1e-4, atol=1e-5)


def test_compile_stats_gives_buffer_bytes_with_and_without_optimizing(rt):
    # conv -> relu fused: the relu's 4x64x64 f32 output (64 KiB) is no
    # buffer of its own any more; as written, the conv's output and the
    # relu's live at once. Asked for nothing, there is no baseline.
    g = backplane.Graph()
    g.input("x", "f32", [1, 4, 64, 64])
    g.constant("w", np.full((4, 4, 3, 3), 0.1, np.float32))
    g.constant("b", np.zeros(4, np.float32))
    g.node("c", "conv2d", ["x", "w", "b"], {"padding": 1})
    g.node("y", "relu", ["c"])
    g.output("y")
    s = rt.compile(g, "cpu", memory_baseline=True).compile_stats()
    assert set(s["buffer_bytes"]) == {"cpu"}
    assert s["unoptimized_buffer_bytes"]["cpu"] >= s["buffer_bytes"]["cpu"] + 4 * 64 * 64 * 4
    assert rt.compile(g, "cpu").compile_stats()["unoptimized_buffer_bytes"] == {}


def test_big_endian_arrays_go_in_as_their_values():
    # '>f4' bytes were once read as they were: byte-swapped values.
    x = np.array([1.5, -2.0, 3.25, 1e-3] * 8192, dtype=">f4")  # 128 KiB: past the in-place threshold too
    g = backplane.Graph()
    g.input("x", "f32", [x.size])
    g.constant("k", np.array([2.0], dtype=">f8").astype(">f4"))
    g.node("y", "mul", ["x", "k"])
    g.output("y")
    plan = backplane.compile(g, "cpu")
    np.testing.assert_array_equal(plan(x=x)["y"], x.astype("<f4") * 2)
    t = backplane.upload(np.array([[7, -1]], dtype=">i8"), device="cpu")
    np.testing.assert_array_equal(t.numpy(), [[7, -1]])
    out = np.zeros(x.size, dtype=">f4")
    with pytest.raises(backplane.Error, match="byte order"):
        plan.bind_output("y", out)


def test_integers_that_do_not_fit_are_refused_not_wrapped():
    g = backplane.Graph()
    g.input("i", "i32", [3])
    g.node("y", "neg", ["i"])
    g.output("y")
    plan = backplane.compile(g, "cpu")
    np.testing.assert_array_equal(plan(i=np.array([1, -2, 3], np.int64))["y"], [-1, 2, -3])  # they fit: fine
    with pytest.raises(backplane.Error, match=r"input 'i': values from 1 to 1099511627776 do not fit i32"):
        plan(i=np.array([1, 2, 1 << 40], np.int64))


def test_a_bad_dtype_is_a_backplane_error():
    g = backplane.Graph()
    for bad in ("f33", "float7", 3.5):
        with pytest.raises(backplane.Error, match="no Backplane dtype"):
            g.input("x", bad, [2])


def test_module_devices_needs_no_numpy():
    # `python3 -m backplane devices` uses no NumPy; it once failed without it.
    code = ("import sys, runpy; sys.modules['numpy'] = None; sys.argv = ['backplane', 'devices']; "
            "runpy.run_module('backplane', run_name='__main__')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "cpu" in r.stdout


def test_submit_from_several_threads_gives_each_its_own_outputs():
    # Completion.wait() once read the plan's outputs after the run ended, so
    # another thread's submission could have overwritten them.
    g = backplane.Graph()
    g.input("x", "f32", [64])
    g.node("y", "neg", ["x"])
    g.output("y")
    plan = backplane.compile(g, "cpu")
    wrong = []

    def work(t):
        for r in range(40):
            x = np.full(64, t * 100 + r, np.float32)
            out = plan.submit(x=x).wait()["y"]
            if not np.array_equal(out, -x):
                wrong.append((t, r))

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert wrong == []



def _long_plan(n=1024, chain=12):
    # A chain of n x n matmuls: long enough (~0.1-1 s on the CPU) for a
    # signal or another thread to act while it runs.
    g = backplane.Graph()
    g.input("x", "f32", [n, n])
    g.constant("w", (np.eye(n, dtype=np.float32) * 0.5).astype(np.float32))
    prev = "x"
    for i in range(chain):
        g.node(f"m{i}", "matmul", [prev, "w"])
        prev = f"m{i}"
    g.output(prev)
    return backplane.compile(g, "cpu"), np.ones((n, n), np.float32), prev


def test_dropping_a_running_completion_lets_other_threads_run():
    # Dropping a Completion waits for its run; it once waited holding the
    # GIL, so every other Python thread stopped until the run ended: the
    # ticker below then records no time inside the drop.
    import time
    plan, x, _ = _long_plan()
    ticks = []
    stop = threading.Event()

    def ticker():
        while not stop.is_set() and len(ticks) < 100000:
            ticks.append(time.perf_counter())
            time.sleep(0.001)

    th = threading.Thread(target=ticker)
    th.start()
    try:
        c = plan.submit(x=x)
        if c.poll():
            pytest.skip("the run ended before the Completion was dropped")
        t0 = time.perf_counter()
        del c
        t1 = time.perf_counter()
    finally:
        stop.set()
        th.join()
    if t1 - t0 < 0.05:
        pytest.skip("the drop was too short to tell")
    # Ticks come every ~1 ms when the thread may run; away from the drop's
    # ends (where a tick may slip in either way).
    inside = [t for t in ticks if t0 + 0.02 < t < t1 - 0.02]
    assert len(inside) >= 5, f"{len(inside)} ticks of another thread during a {t1 - t0:.3f} s drop"


def test_ctrl_c_reaches_python_during_wait():
    # Completion.wait() looks for signals while the run goes on: SIGINT
    # raises KeyboardInterrupt before the run ends, and a second wait() gives
    # the run's outputs (would catch a wait that blocks until the end, or an
    # interrupt that loses the run).
    import signal
    plan, x, out = _long_plan()
    c = plan.submit(x=x)
    timer = threading.Timer(0.02, lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.start()
    interrupted_early = None
    try:
        c.wait()
    except KeyboardInterrupt:
        interrupted_early = not c.poll()
    finally:
        timer.cancel()
    if interrupted_early is None:
        pytest.skip("the run ended before the signal arrived")
    assert interrupted_early
    y = c.wait()[out]
    assert np.allclose(y, 0.5 ** 12)

def test_dynamic_dims(rt):
    # One plan at every seq: values against NumPy at each size, a size seen
    # before not compiled again (would catch a plan stuck at its first size,
    # or one that compiles every call).
    g = backplane.Graph()
    g.input("x", "f32", ["seq", 3])
    g.input("shift", "f32", [1])
    g.constant("w", np.arange(6, dtype=np.float32).reshape(3, 2))
    g.node("m", "matmul", ["x", "w"])
    g.node("y", "add", ["m", "shift"])
    g.output("y")
    for dev in device_names(rt):
        plan = rt.compile(g, dev, dims={"seq": 4})
        assert plan.dims == {"seq": 4}
        placed = plan.placement()
        # The CPU runs matmul -> add as its fused cpu.matmul_add.
        want = [("y", "cpu.matmul_add", dev)] if dev == "cpu" else [("m", "matmul", dev), ("y", "add", dev)]
        assert [(p["node"], p["op"], p["device"]) for p in placed] == want
        assert all(p["reason"] for p in placed)
        for seq in (4, 1, 7, 1, 4):
            x = (np.arange(seq * 3, dtype=np.float32).reshape(seq, 3) % 5) - 2
            y = plan(shift=np.array([seq], np.float32), x=x)["y"]
            np.testing.assert_allclose(y, x @ np.arange(6, dtype=np.float32).reshape(3, 2) + seq, rtol=1e-6)
            assert plan.dims == {"seq": seq}
        assert plan.specializations == 3
        plan.set_dims({"seq": 7})
        assert plan.dims == {"seq": 7} and plan.specializations == 3
        with pytest.raises(backplane.Error, match="'len' is no dynamic dim"):
            plan.set_dims({"len": 2})

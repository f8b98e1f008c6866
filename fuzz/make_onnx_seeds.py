#!/usr/bin/python3
"""Writes the seed corpus of fuzz_onnx (fuzz/corpus/fuzz_onnx/): small ONNX
models covering the importer's paths (Conv + BatchNormalization, shape
arithmetic, Gemm, Slice, pooling, LayerNorm/GELU compositions, dynamic
dims, an unmapped op). Needs Debian's python3-onnx."""
import os

import numpy as np
from onnx import TensorProto, helper, numpy_helper

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "fuzz_onnx")


def f(name, *shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape))


def init(name, a):
    return numpy_helper.from_array(np.asarray(a), name)


def save(name, nodes, inputs, outputs, inits=(), opset=13):
    g = helper.make_graph(nodes, name, inputs, outputs, list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], producer_name="seed")
    with open(os.path.join(OUT, name + ".onnx"), "wb") as fh:
        fh.write(m.SerializeToString())


def main():
    os.makedirs(OUT, exist_ok=True)
    r = np.random.RandomState(0)
    save("conv_bn_relu_pool", [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], strides=[1, 1]),
        helper.make_node("BatchNormalization", ["c", "g", "bb", "m", "v"], ["n"], epsilon=1e-5),
        helper.make_node("Relu", ["n"], ["r"]),
        helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1),
        helper.make_node("GlobalAveragePool", ["p"], ["y"]),
    ], [f("x", 1, 2, 5, 5)], [f("y", 1, 3, 1, 1)], [
        init("w", r.rand(3, 2, 3, 3).astype(np.float32)), init("b", r.rand(3).astype(np.float32)),
        init("g", r.rand(3).astype(np.float32)), init("bb", r.rand(3).astype(np.float32)),
        init("m", r.rand(3).astype(np.float32)), init("v", r.rand(3).astype(np.float32) + 0.5)])
    save("shape_arith_reshape", [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
        helper.make_node("Unsqueeze", ["n", "ax"], ["n1"]),
        helper.make_node("Concat", ["n1", "m1"], ["shape"], axis=0),
        helper.make_node("Reshape", ["x", "shape"], ["y"]),
    ], [f("x", "batch", 2, 3)], [f("y", "batch", 6)], [
        init("zero", np.array(0, np.int64)), init("ax", np.array([0], np.int64)),
        init("m1", np.array([-1], np.int64))])
    save("gemm_softmax", [
        helper.make_node("Gemm", ["a", "b", "c"], ["g"], transB=1, alpha=0.5, beta=2.0),
        helper.make_node("Softmax", ["g"], ["y"], axis=-1),
    ], [f("a", 2, 4)], [f("y", 2, 3)], [init("b", r.rand(3, 4).astype(np.float32)),
                                         init("c", r.rand(3).astype(np.float32))])
    save("slice_split_concat", [
        helper.make_node("Slice", ["x", "st", "en", "axs", "stp"], ["s"]),
        helper.make_node("Split", ["x", "parts"], ["a", "b"], axis=1),
        helper.make_node("Concat", ["b", "a"], ["c"], axis=1),
        helper.make_node("Transpose", ["c"], ["y"], perm=[1, 0]),
    ], [f("x", 4, 6)], [f("y", 6, 4), f("s", 2, 3)], [
        init("st", np.array([3, -1], np.int64)), init("en", np.array([-9223372036854775808, 0], np.int64)),
        init("axs", np.array([0, 1], np.int64)), init("stp", np.array([-2, -2], np.int64)),
        init("parts", np.array([2, 4], np.int64))])
    ln = [
        helper.make_node("ReduceMean", ["x"], ["m"], axes=[-1]),
        helper.make_node("Sub", ["x", "m"], ["d"]),
        helper.make_node("Pow", ["d", "two"], ["d2"]),
        helper.make_node("ReduceMean", ["d2"], ["v"], axes=[-1]),
        helper.make_node("Add", ["v", "eps"], ["ve"]),
        helper.make_node("Sqrt", ["ve"], ["sd"]),
        helper.make_node("Div", ["d", "sd"], ["n"]),
        helper.make_node("Mul", ["n", "w"], ["nw"]),
        helper.make_node("Add", ["nw", "bias"], ["h"]),
        helper.make_node("Div", ["h", "sqrt2"], ["hs"]),
        helper.make_node("Erf", ["hs"], ["e"]),
        helper.make_node("Add", ["e", "one"], ["e1"]),
        helper.make_node("Mul", ["h", "e1"], ["he"]),
        helper.make_node("Mul", ["he", "half"], ["y"]),
    ]
    save("layernorm_gelu", ln, [f("x", 2, 8)], [f("y", 2, 8)], [
        init("two", np.array(2, np.float32)), init("eps", np.array(1e-5, np.float32)),
        init("w", r.rand(8).astype(np.float32)), init("bias", r.rand(8).astype(np.float32)),
        init("sqrt2", np.array(1.4142135, np.float32)), init("one", np.array(1, np.float32)),
        init("half", np.array(0.5, np.float32))])
    save("where_mask_range", [
        helper.make_node("Range", ["r0", "r1", "r2"], ["idx"]),
        helper.make_node("Less", ["idx", "lim"], ["mask"]),
        helper.make_node("Where", ["mask", "x", "ninf"], ["w"]),
        helper.make_node("Softmax", ["w"], ["y"], axis=-1),
        helper.make_node("ConstantOfShape", ["shp"], ["z"], value=numpy_helper.from_array(np.array([1.5], np.float32))),
        helper.make_node("Add", ["y", "z"], ["out"]),
    ], [f("x", 3, 4)], [f("out", 3, 4)], [
        init("r0", np.array(0, np.int64)), init("r1", np.array(4, np.int64)), init("r2", np.array(1, np.int64)),
        init("lim", np.array(3, np.int64)), init("ninf", np.array(-np.inf, np.float32)),
        init("shp", np.array([3, 4], np.int64))])
    save("unmapped_op", [helper.make_node("Hardmax", ["x"], ["y"])], [f("x", 2, 3)], [f("y", 2, 3)])
    save("topk_cumsum_trilu", [
        helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=-1),
        helper.make_node("CumSum", ["v", "ax"], ["c"]),
        helper.make_node("Trilu", ["c"], ["y"], upper=0),
    ], [f("x", 3, 5)], [f("y", 3, 2)], [init("k", np.array([2], np.int64)), init("ax", np.array(1, np.int64))],
        opset=14)


if __name__ == "__main__":
    main()

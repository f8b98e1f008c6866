#!/bin/sh
# A chain of convolutions at batch 1 on two threads, as the layout pass and
# the CPU's channels-last variants run it (docs/architecture.md, "Planner"):
# oneDNN's execution log (ONEDNN_VERBOSE=1) must show channels-last (acdb)
# input and output on every convolution, the 56x56 layers split into bands
# of output rows (oh28 of 56), the weight-heavy 28x28 layer split by output
# channels (oc128 of 256), and no reorder of an activation back to NCHW.
# (With biases: a vendor op's inputs are all required, so a conv2d without
# one keeps its layout.) The values are checked by the [optimize] tests. Skipped (77) on a machine
# where the plugin uses no oneDNN for f32 (no AVX-512).
bin="$1"
. "$(dirname "$0")/onednn_common.sh"  # skips without oneDNN f32; $dir
cat > "$dir/graph.json" <<'GRAPH'
{
  "inputs": {
    "x": {"value": 0.5, "dtype": "f32", "shape": [1, 32, 56, 56]},
    "wa": {"value": 0.01, "dtype": "f32", "shape": [32, 32, 3, 3]},
    "wb": {"value": 0.01, "dtype": "f32", "shape": [32, 32, 3, 3]},
    "wc": {"value": 0.01, "dtype": "f32", "shape": [64, 32, 3, 3]},
    "wd": {"value": 0.01, "dtype": "f32", "shape": [256, 64, 3, 3]},
    "b32": {"value": 0.1, "dtype": "f32", "shape": [32]},
    "b64": {"value": 0.1, "dtype": "f32", "shape": [64]},
    "b256": {"value": 0.1, "dtype": "f32", "shape": [256]}
  },
  "nodes": [
    {"name": "a", "op": "conv2d", "inputs": ["x", "wa", "b32"], "params": {"padding": 1}},
    {"name": "ar", "op": "relu", "inputs": ["a"]},
    {"name": "b", "op": "conv2d", "inputs": ["ar", "wb", "b32"], "params": {"padding": 1}},
    {"name": "c", "op": "conv2d", "inputs": ["b", "wc", "b64"], "params": {"padding": 1, "stride": 2}},
    {"name": "d", "op": "conv2d", "inputs": ["c", "wd", "b256"], "params": {"padding": 1}}
  ],
  "outputs": ["d"]
}
GRAPH
log=$(BACKPLANE_PLUGIN_PATH= BACKPLANE_NUM_THREADS=2 ONEDNN_VERBOSE=1 "$bin" run "$dir/graph.json" --device cpu --out "$dir/out" --explain 2>&1)
status=0
fail() { echo "$1"; status=1; }
convs=$(echo "$log" | grep "onednn_verbose,exec,cpu,convolution,")
echo "$log" | grep -q "as cpu.conv2d_nhwc" || fail "the layout pass did not put the channels-last variants in (explain)"
[ -n "$convs" ] || fail "no oneDNN convolution ran"
echo "$convs" | grep -v -q "src_f32::blocked:acdb.*dst_f32::blocked:acdb" &&
  fail "a convolution ran with a layout other than channels-last on both sides: $(echo "$convs" | grep -v "src_f32::blocked:acdb.*dst_f32::blocked:acdb" | head -2)"
echo "$convs" | grep -q "mb1_ic32oc32_ih[0-9]*oh28kh3sh1" && echo "56x56 layers: split into bands of 28 rows" ||
  fail "56x56 layers: no band of 28 output rows in the log"
echo "$convs" | grep -q "mb1_ic64oc128_ih28oh28" && echo "the weight-heavy 28x28 layer: split by output channels" ||
  fail "the weight-heavy layer: no slice of 128 output channels in the log"
echo "$log" | grep "onednn_verbose,exec,cpu,reorder," | grep -q "src_f32::blocked:acdb.*dst_f32::blocked:abcd" &&
  fail "an activation was reordered back to NCHW"
[ $status -eq 0 ] || echo "$convs" | head -8
exit $status

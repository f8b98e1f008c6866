#!/bin/sh
# At batch 1 on two threads the CPU plugin splits a convolution it hands to
# oneDNN by output channels (16 at a time) and a grouped one by groups, so
# both threads work on one image: oneDNN's execution log (ONEDNN_VERBOSE=1)
# must show the smaller primitives, not one over all channels. The values
# on this path are checked by the [onednn] tests. Skipped (77) on a machine
# where the plugin uses no oneDNN for f32 (no AVX-512).
bin="$1"
. "$(dirname "$0")/onednn_common.sh"  # skips without oneDNN f32; $dir
cat > "$dir/graph.json" <<'GRAPH'
{
  "inputs": {
    "x": {"value": 0.5, "dtype": "f32", "shape": [1, 64, 56, 56]},
    "w": {"value": 0.25, "dtype": "f32", "shape": [64, 64, 3, 3]},
    "xg": {"value": 0.5, "dtype": "f32", "shape": [1, 128, 56, 56]},
    "wg": {"value": 0.25, "dtype": "f32", "shape": [128, 8, 3, 3]}
  },
  "nodes": [
    {"name": "y", "op": "conv2d", "inputs": ["x", "w", null], "params": {"padding": 1, "stride": 2}},
    {"name": "yg", "op": "conv2d", "inputs": ["xg", "wg", null], "params": {"padding": 1, "groups": 16}}
  ],
  "outputs": ["y", "yg"]
}
GRAPH
log=$(BACKPLANE_PLUGIN_PATH= BACKPLANE_NUM_THREADS=2 ONEDNN_VERBOSE=1 "$bin" run "$dir/graph.json" --device cpu --out "$dir/out" 2>&1)
status=0
convs=$(echo "$log" | grep "onednn_verbose,exec,cpu,convolution,")
# 64 output channels in pieces of 16; 16 groups in pieces of whole groups.
# (Stride 2 and 8 channels per group: f32 3x3 stride-1 convolutions with 16
# channels and more take the plugin's Winograd instead of oneDNN.)
if echo "$convs" | grep -q "mb1_ic64oc16_"; then
  echo "64 -> 64 channels at batch 1: split by output channels"
else
  echo "64 -> 64 channels at batch 1: no oneDNN convolution over 16 output channels in the log:"
  echo "$convs" | head -5
  status=1
fi
if echo "$convs" | grep -q "g[0-9]*mb1_ic" && ! echo "$convs" | grep -q "g16mb1_ic"; then
  echo "16 groups at batch 1: split by groups"
else
  echo "16 groups at batch 1: not split by groups in the log:"
  echo "$convs" | head -5
  status=1
fi
exit $status

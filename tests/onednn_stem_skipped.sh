#!/bin/sh
# A first layer (3 input channels, 3x3) in the channels-last variant takes
# the CPU plugin's own stem kernel (plugins/cpu/stem.cpp), not oneDNN: with
# oneDNN forced on (BACKPLANE_CPU_ONEDNN=always) its execution log must show
# the 8-channel convolution after it and no convolution with 3 input
# channels. The values are checked by the [optimize] tests. Skipped (77)
# on a machine where the plugin uses no oneDNN for f32 (no AVX-512).
bin="$1"
. "$(dirname "$0")/onednn_common.sh"  # skips without oneDNN f32; $dir
cat > "$dir/graph.json" <<'GRAPH'
{
  "inputs": {
    "x": {"value": 0.5, "dtype": "f32", "shape": [1, 3, 64, 64]},
    "x8": {"value": 0.5, "dtype": "f32", "shape": [1, 8, 32, 32]},
    "w3": {"value": 0.01, "dtype": "f32", "shape": [32, 3, 3, 3]},
    "w8": {"value": 0.01, "dtype": "f32", "shape": [32, 8, 3, 3]},
    "b": {"value": 0.1, "dtype": "f32", "shape": [32]}
  },
  "nodes": [
    {"name": "stem", "op": "cpu.conv2d_relu_nhwc", "inputs": ["x", "w3", "b"], "params": {"padding": 1, "stride": 2}},
    {"name": "next", "op": "cpu.conv2d_relu_nhwc", "inputs": ["x8", "w8", "b"], "params": {"padding": 1}}
  ],
  "outputs": ["stem", "next"]
}
GRAPH
log=$(BACKPLANE_PLUGIN_PATH= BACKPLANE_CPU_ONEDNN=always BACKPLANE_NUM_THREADS=2 ONEDNN_VERBOSE=1 \
  "$bin" run "$dir/graph.json" --device cpu --out "$dir/out" 2>&1)
status=0
fail() { echo "$1"; status=1; }
convs=$(echo "$log" | grep "onednn_verbose,exec,cpu,convolution,")
echo "$convs" | grep -q "mb1_ic8oc32" && echo "the 8-channel convolution: in oneDNN's log" ||
  fail "the 8-channel convolution is not in oneDNN's log (is the log on?)"
echo "$convs" | grep -q "_ic3oc" && fail "the 3-channel stem ran in oneDNN: $(echo "$convs" | grep "_ic3oc" | head -1)" ||
  echo "the 3-channel stem: not in oneDNN's log (the plugin's stem kernel)"
[ -s "$dir/out/stem.npy" ] || fail "no stem output written"
exit $status

#!/bin/sh
# The CPU plugin takes its Winograd path for wide f32 3x3 stride-1
# convolutions (conv.cpp): the plugin's debug log names the packed form a
# kernel made for its constant weights ("kept packed as winograd,..."), so a
# run of such a convolution must show it, and a stride-2 one must not. The
# value tests (test_optimize.cpp, test_cpu_onednn.cpp) check the results on
# whichever path runs; this checks the path. Would catch: a change to
# winograd_pays or the path choice that sends every convolution to the
# GEMM or oneDNN while the values stay right.
bin="$1"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
status=0
run() {  # label, stride, expected count of Winograd packings, ISA
  cat > "$dir/g.json" <<JSON
{"inputs": {"x": {"dtype": "f32", "shape": [1, 32, 28, 28]},
            "w": {"value": 0.01, "dtype": "f32", "shape": [32, 32, 3, 3]}},
 "nodes": [{"name": "y", "op": "conv2d", "inputs": ["x", "w"], "params": {"padding": 1, "stride": $2}}],
 "outputs": ["y"]}
JSON
  log=$(BACKPLANE_PLUGIN_PATH= BACKPLANE_LOG=0 BACKPLANE_CPU_ISA=$4 "$bin" bench --device cpu --model "$dir/g.json" --min-time 0.01 2>&1)
  if ! echo "$log" | grep -q "median run"; then
    echo "$1: the bench did not run:"; echo "$log" | tail -5; status=1; return
  fi
  got=$(echo "$log" | grep -c "conv2d: input 1 kept packed as winograd,")
  echo "$1 ($4): $got Winograd packing(s), expected $3"
  [ "$got" = "$3" ] || { echo "$log" | grep "kept packed"; status=1; }
}
for isa in baseline avx2 avx512; do
  run "3x3 stride 1, 32 -> 32 at 28x28" 1 1 $isa
  run "3x3 stride 2, 32 -> 32 at 28x28" 2 0 $isa
done
exit $status

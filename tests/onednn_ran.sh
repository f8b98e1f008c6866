#!/bin/sh
# The CPU plugin hands matmul and conv2d to oneDNN where it says it uses
# oneDNN: oneDNN's own execution log (ONEDNN_VERBOSE=1) must show the
# primitives. The [onednn] tests and the conformance runs check the values
# on whichever path runs; this checks the path itself. Skipped (77) on a
# machine where the plugin uses no oneDNN for f32 (no AVX-512).
bin="$1"
. "$(dirname "$0")/onednn_common.sh"  # skips without oneDNN f32; $dir
status=0
expect() {  # case, primitive
  log=$(BACKPLANE_PLUGIN_PATH= ONEDNN_VERBOSE=1 "$bin" bench --device cpu --filter "$1" --min-time 0.01 2>&1)
  if echo "$log" | grep -q "onednn_verbose,exec,cpu,$2,"; then
    echo "$1: ran in oneDNN ($2)"
  else
    echo "$1: no oneDNN $2 execution in the log:"
    echo "$log" | tail -5
    status=1
  fi
}
expect matmul_1024 matmul
# f32 3x3 stride-1 convolutions take the plugin's Winograd (onednn_split_ran.sh
# checks f32 convolutions that oneDNN runs); bf16 ones go to oneDNN.
case "$desc" in
  *avx512_core_bf16*|*amx*)
    expect matmul_1024_bf16 matmul
    expect conv2d_n8c64_56_k64_3x3_bf16 convolution ;;
esac
exit $status

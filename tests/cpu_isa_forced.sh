#!/bin/sh
# The forced-path conformance runs (cpu_conformance_isa_*, _onednn_*) run the
# path their variables ask for: the CPU device's description says which ISA
# the plugin's own kernels use and whether, and capped where, oneDNN runs.
# Each variable setting must give its description; a wrong or ignored
# variable fails. Skipped (77) without AVX-512, where levels fall back.
bin="$1"
describe() { env "$@" BACKPLANE_PLUGIN_PATH= "$bin" devices --load 2>&1 | grep -A1 '^cpu ' | tail -1; }
native=$(describe)
echo "native: $native"
case "$native" in
  *avx512*) ;;
  *) echo "no AVX-512 here: the forced levels fall back; skipped"; exit 77 ;;
esac
status=0
check() {  # pattern, VAR=value...
  want="$1"
  shift
  got=$(describe "$@")
  echo "$*: $got"
  case "$got" in
    $want) ;;
    *) echo "  expected a description matching $want"; status=1 ;;
  esac
}
check '*(avx512, [0-9]* threads)' BACKPLANE_CPU_ISA=avx512  # own kernels alone: no oneDNN
check '*(avx2, [0-9]* threads)' BACKPLANE_CPU_ISA=avx2
check '*(baseline, [0-9]* threads)' BACKPLANE_CPU_ISA=baseline
check '*(avx512, [0-9]* threads)' BACKPLANE_CPU_ONEDNN=0
case "$native" in
  *oneDNN*)
    check '*oneDNN *' BACKPLANE_CPU_ONEDNN=always
    check '*oneDNN * avx512_core_bf16,*' BACKPLANE_CPU_ONEDNN=always BACKPLANE_CPU_ISA=avx512_bf16
    ;;
  *) echo "this build has no oneDNN (sanitizer builds leave it out): its settings not checked" ;;
esac
exit $status

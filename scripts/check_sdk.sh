#!/usr/bin/env bash
# Installs the SDK from BUILD_DIR into a temporary prefix and builds, against
# that prefix only, the skeleton plugin, the example plugin (and its broken
# variant) and the example host app; then runs the conformance suite on the
# CPU, Vulkan and example plugins, and checks that the broken variant fails
# naming its kernel.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${BUILD_DIR:-build}"
OOT="${OOT_DIR:-$BUILD_DIR/out-of-tree}"
prefix="$OOT/prefix"
rm -rf "$OOT"
mkdir -p "$OOT"
cmake --install "$BUILD_DIR" --prefix "$prefix" >/dev/null
bp="$prefix/bin/backplane"

for ex in skeleton_plugin acme_plugin host_app; do
  cmake -S "examples/$ex" -B "$OOT/$ex" -DCMAKE_PREFIX_PATH="$PWD/$prefix" >/dev/null
  cmake --build "$OOT/$ex" -j "${JOBS:-2}" >/dev/null
  echo "built examples/$ex against the installed package"
done
cmake -S examples/acme_plugin -B "$OOT/acme_broken" -DCMAKE_PREFIX_PATH="$PWD/$prefix" -DACME_BROKEN=ON >/dev/null
cmake --build "$OOT/acme_broken" >/dev/null

echo "== the installed plugins =="
"$bp" devices --load
echo "== skeleton: loads, no devices, its manifest matches =="
"$bp" manifest "$OOT/skeleton_plugin/plugins/libbackplane_skeleton.so" --check examples/skeleton_plugin/skeleton.json
BACKPLANE_PLUGIN_PATH="$OOT/skeleton_plugin/plugins" "$bp" conformance --plugin skeleton --quiet

echo "== conformance: cpu, vulkan, acme =="
"$bp" conformance --plugin cpu --quick --quiet --json "$OOT/cpu-conformance.json"
"$bp" conformance --plugin vulkan --quick --quiet --json "$OOT/vulkan-conformance.json"
export BACKPLANE_PLUGIN_PATH="$OOT/acme_plugin/plugins"
"$bp" conformance --plugin acme --quiet --strict --json "$OOT/acme-conformance.json"
"$bp" run examples/acme_plugin/swiglu_graph.json --device acme0

echo "== a graph acme covers only in part: acme0 with the CPU (and Vulkan) against the CPU alone =="
"$bp" run examples/acme_plugin/mixed_graph.json --device cpu --out "$OOT/mixed_cpu" >/dev/null
"$bp" run examples/acme_plugin/mixed_graph.json --device acme0,cpu --explain --out "$OOT/mixed_acme_cpu" | tee "$OOT/mixed_explain.txt"
grep -q "h (acme.swiglu) *-> acme0" "$OOT/mixed_explain.txt"
grep -q "s (softmax) *-> cpu" "$OOT/mixed_explain.txt"
lists=("mixed_acme_cpu")
if "$bp" devices --load | grep -q '^vulkan0'; then
  "$bp" run examples/acme_plugin/mixed_graph.json --device acme0,vulkan0,cpu --explain --out "$OOT/mixed_acme_vulkan_cpu"
  lists+=("mixed_acme_vulkan_cpu")
fi
echo "== acme.swiglu found by pattern where a graph spells it out (slice, silu, mul); a shifted slice is a near miss =="
"$bp" run examples/acme_plugin/swiglu_spelled_out.json --device acme0,cpu --explain --out "$OOT/spelled_acme_cpu" |
  tee "$OOT/spelled_explain.txt"
grep -q "node 'h' (mul) with .*: replaced by acme.swiglu on acme0" "$OOT/spelled_explain.txt"
grep -q "h (acme.swiglu) *-> acme0" "$OOT/spelled_explain.txt"
grep -q "node 'near' (mul): not replaced by acme.swiglu .*node 'shifted' has params the decomposition does not give" \
  "$OOT/spelled_explain.txt"
"$bp" run examples/acme_plugin/swiglu_spelled_out.json --device cpu --optimize none --out "$OOT/spelled_cpu" >/dev/null
compare_outputs() {
  /usr/bin/python3 - "$1" "$2" <<'PY'
import os, sys
import numpy as np
ref, got = sys.argv[1], sys.argv[2]
for name in sorted(os.listdir(ref)):
    a, b = np.load(os.path.join(ref, name)), np.load(os.path.join(got, name))
    assert a.shape == b.shape and a.dtype == b.dtype, (name, a.shape, b.shape)
    if a.dtype.kind == "f":
        assert np.allclose(a, b, rtol=1e-4, atol=1e-6), (name, a, b)
    else:
        assert np.array_equal(a, b), (name, a, b)
print(f"{os.path.basename(got)}: every output matches the CPU alone")
PY
}
compare_outputs "$OOT/spelled_cpu" "$OOT/spelled_acme_cpu"
for l in "${lists[@]}"; do
  compare_outputs "$OOT/mixed_cpu" "$OOT/$l"
done
"$OOT/host_app/host_app"
BACKPLANE_DEVICE=acme0 "$OOT/host_app/host_app" examples/acme_plugin/swiglu_graph.json | tee "$OOT/host_app.txt"
grep -q "ran on device 'acme0'" "$OOT/host_app.txt"

echo "== the broken variant must fail and name its kernel =="
set +e
BACKPLANE_PLUGIN_PATH="$OOT/acme_broken/plugins" "$bp" conformance --plugin acme --quiet > "$OOT/broken.txt" 2>&1
rc=$?
set -e
tail -5 "$OOT/broken.txt"
if [ $rc -eq 0 ] || ! grep -q "FAILED add \[f32,f32->f32\]" "$OOT/broken.txt"; then
  echo "the conformance suite did not catch the broken add kernel" >&2
  exit 1
fi
if ! grep -q "FAILED acme.swiglu \[f32->f32\] contiguous: .*reference: its decomposition" "$OOT/broken.txt"; then
  echo "the conformance suite did not catch the broken acme.swiglu kernel through its decomposition" >&2
  exit 1
fi
echo "SDK checks passed"

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
"$bp" conformance --plugin acme --quiet --json "$OOT/acme-conformance.json"
"$bp" run examples/acme_plugin/swiglu_graph.json --device acme0
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
echo "SDK checks passed"

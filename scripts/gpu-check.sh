#!/usr/bin/env bash
# The checks that need a real GPU, in one script of at most ~8 minutes on a
# machine with an NVIDIA (or any) GPU and its Vulkan driver:
#   1. builds what they need (core, CPU and Vulkan plugins, the command,
#      the Python package) in $BUILD_DIR (default build-gpu);
#   2. lists the devices and finds the GPU's Vulkan device (kind "gpu");
#   3. the quick Vulkan conformance suite on every Vulkan device;
#   4. `backplane bench` on the GPU's device (and, last, `bench --generate`);
#   5. the model set (tests/models) on the GPU's device and split with the CPU;
# then prints one summary. Each step has its own time limit; a step that
# cannot run says why and the others go on. Installs nothing (a device
# machine may reach no package registry): missing tools are reported.
#
#   bash scripts/gpu-check.sh            # JOBS=N, BUILD_DIR=DIR, STEP_LIMIT=S override
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${BUILD_DIR:-build-gpu}"
JOBS="${JOBS:-$(nproc)}"
STEP_LIMIT="${STEP_LIMIT:-150}"
start=$(date +%s)
summary=()
# The last part of a pipeline runs in this shell, so `... | while read; do note; done`
# adds to the summary (in a subshell the lines were lost).
shopt -s lastpipe
note() { summary+=("$1"); echo "== $1"; }
elapsed() { echo $(( $(date +%s) - start )); }

echo "== machine: $(nproc) cores, $(uname -r)"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
for tool in cmake g++ glslangValidator; do
  command -v "$tool" >/dev/null || note "missing tool: $tool"
done
ls /usr/share/vulkan/icd.d/ /etc/vulkan/icd.d/ 2>/dev/null | sed 's/^/   ICD: /'

# 1. Build.
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DBACKPLANE_REMOTE=OFF -DBACKPLANE_BUILD_TESTS=OFF \
  > "$BUILD_DIR.cmake.log" 2>&1 || { note "configure failed (tail of $BUILD_DIR.cmake.log below)"; tail -20 "$BUILD_DIR.cmake.log"; }
targets=(backplane backplane_cpu)
if cmake --build "$BUILD_DIR" --target help 2>/dev/null | grep -q backplane_vulkan; then targets+=(backplane_vulkan); else note "no Vulkan plugin in this build (libvulkan-dev, glslang-tools?)"; fi
if cmake --build "$BUILD_DIR" --target help 2>/dev/null | grep -q backplane_python; then targets+=(backplane_python); fi
if timeout 420 cmake --build "$BUILD_DIR" -j "$JOBS" --target "${targets[@]}" > "$BUILD_DIR.build.log" 2>&1; then
  note "build: ${targets[*]} in $(elapsed) s"
else
  note "build FAILED after $(elapsed) s (tail below)"; tail -30 "$BUILD_DIR.build.log"
fi
BP="$BUILD_DIR/bin/backplane"
[ -x "$BP" ] || { printf '%s\n' "${summary[@]}"; exit 1; }

# 2. Devices.
"$BP" devices --load | tee "$BUILD_DIR.devices.txt"
gpu=$("$BP" devices --load --json 2>/dev/null | /usr/bin/python3 -c '
import json, sys
d = json.load(sys.stdin)
rows = d["devices"] if isinstance(d, dict) else d
print(next((r.get("name", "") for r in rows if r.get("plugin") == "vulkan" and r.get("kind") == "gpu"), ""))' 2>/dev/null)
if [ -z "$gpu" ]; then
  note "no Vulkan GPU device found (only lavapipe, or no Vulkan driver): GPU steps skipped"
else
  note "GPU Vulkan device: $gpu"
fi

# 3. Quick conformance on every Vulkan device.
if [ -n "$gpu" ]; then
  timeout "$STEP_LIMIT" "$BP" conformance --plugin vulkan --quick --quiet > "$BUILD_DIR.conformance.log" 2>&1
  rc=$?
  note "conformance --plugin vulkan --quick: exit $rc; $(grep -E '^device .*cases passed' "$BUILD_DIR.conformance.log" | tr '\n' ';')"
  [ $rc -ne 0 ] && grep -m 15 "FAIL" "$BUILD_DIR.conformance.log"
fi

# 4. Per-op benchmark on the GPU.
if [ -n "$gpu" ]; then
  timeout "$STEP_LIMIT" "$BP" bench --device "$gpu" --min-time 0.2 > "$BUILD_DIR.bench.txt" 2>&1
  note "bench on $gpu: exit $?"
  cat "$BUILD_DIR.bench.txt"
fi

# 5. The model set on the GPU, alone and split with the CPU.
if [ -n "$gpu" ] && [ -d "$BUILD_DIR/python/backplane" ]; then
  for m in resnet18 mobilenet_v2 squeezenet1_1 shufflenet_v2_x0_5 encoder decoder; do
    out=$(PYTHONPATH="$BUILD_DIR/python" timeout 120 /usr/bin/python3 tests/models/check_model.py "$m" \
          --device "$gpu" --device "$gpu,cpu" 2>&1)
    rc=$?
    note "model $m on $gpu and $gpu,cpu: exit $rc ($(echo "$out" | grep -E '^  ok|^FAIL|^SKIP' | tr '\n' ';'))"
    printf '%s\n' "$out" | tail -5
  done
  for m in resnet18 encoder; do
    PYTHONPATH="$BUILD_DIR/python" timeout 60 /usr/bin/python3 -c "
import sys; sys.path.insert(0, 'tests/models')
import models, tempfile, os
d = tempfile.mkdtemp(); p = os.path.join(d, '$m.onnx'); models.export('$m', p); print(p)" > "$BUILD_DIR.$m.path" 2>/dev/null &&
      timeout 60 "$BP" bench --model "$(tail -1 "$BUILD_DIR.$m.path")" --device "$gpu" 2>&1 | tail -1 |
      while read -r line; do note "bench --model $m: $line"; done
  done
elif [ -n "$gpu" ]; then
  note "no Python package in this build (pybind11-dev, python3-dev, python3-torch?): model set skipped"
fi

# 6. The text generator's decoder (bench size, ~200 M parameters) on the GPU:
# f32 and bf16 weights, the prompt in one run and a token per run.
if [ -n "$gpu" ]; then
  for dt in f32 bf16; do
    timeout 120 "$BP" bench --generate --device "$gpu,cpu" --dtype "$dt" --prompt 64 --tokens 32 2>&1 |
      grep -E "tokens/s|roof|error" | while read -r line; do note "bench --generate $dt on $gpu,cpu: $line"; done
  done
fi

echo
echo "== summary ($(elapsed) s)"
printf '  %s\n' "${summary[@]}"

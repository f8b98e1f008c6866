#!/usr/bin/env bash
# Fuzzing for CI: builds the libFuzzer harnesses of fuzz/ with clang (core and
# test plugin instrumented with ASan+UBSan) in their own build folder, then
# runs each harness for a bounded time from its checked-in seed corpus.
# Exits non-zero on any finding: a crash, a sanitizer report, a leak, a
# timeout (an input running over 10 s), an out-of-memory (over 2 GiB in all,
# or one allocation over 256 MiB: a 64 KiB input asking for more), or a
# harness check that failed. Prints the executions per harness.
#
# The checked-in corpus (fuzz/corpus/<harness>/) is only read: new inputs go
# to a temporary folder. Findings are copied to $BUILD_DIR/fuzz-findings/
# (replay one with `$BUILD_DIR/bin/<harness> <file>`, or with
# `build/bin/fuzz_replay <file>` in the normal build).
#
# Environment: FUZZ_BUILD_DIR (default build-fuzz), FUZZ_TIME (seconds per
# harness, default 60), FUZZ_HARNESSES (default: all seven; one not built is skipped), JOBS (default:
# all cores), SKIP_APT=1 (packages already there).
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD_DIR="${FUZZ_BUILD_DIR:-build-fuzz}"
TIME="${FUZZ_TIME:-60}"
JOBS="${JOBS:-$(nproc)}"
HARNESSES="${FUZZ_HARNESSES:-fuzz_graph fuzz_npy fuzz_manifest fuzz_plan fuzz_remote fuzz_session fuzz_onnx}"
start=$(date +%s)

# ---- clang and libFuzzer ------------------------------------------------------
have_libfuzzer() {
  command -v clang++ >/dev/null 2>&1 || return 1
  local probe
  probe=$(mktemp -d)
  printf '#include <cstddef>\n#include <cstdint>\nextern "C" int LLVMFuzzerTestOneInput(const uint8_t*, size_t) { return 0; }\n' \
    > "$probe/p.cpp"
  local ok=0
  clang++ -fsanitize=fuzzer,address,undefined "$probe/p.cpp" -o "$probe/p" >/dev/null 2>&1 || ok=1
  rm -rf "$probe"
  return $ok
}
if [ "${SKIP_APT:-0}" != 1 ]; then
  packages=(clang libfuzzer-14-dev cmake pkg-config libboost-dev nlohmann-json3-dev)
  missing=()
  for p in "${packages[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  if [ ${#missing[@]} -gt 0 ] || ! have_libfuzzer; then
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${packages[@]}"
  fi
fi
if ! have_libfuzzer; then
  echo "fuzz.sh: clang++ cannot link -fsanitize=fuzzer (install clang and libfuzzer-14-dev)" >&2
  exit 2
fi

# ---- build ------------------------------------------------------------------------
CC=clang CXX=clang++ cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DBACKPLANE_FUZZ=ON \
  -DBACKPLANE_PLUGIN_CPU=OFF -DBACKPLANE_PLUGIN_VULKAN=OFF -DBACKPLANE_BUILD_TESTS=OFF >/dev/null
cmake --build "$BUILD_DIR" -j "$JOBS" --target fuzz_all
echo "-- build: $(( $(date +%s) - start )) s"

# ---- run ----------------------------------------------------------------------------
findings_dir="$BUILD_DIR/fuzz-findings"
rm -rf "$findings_dir"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:symbolize=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
failed=()
summary=()
for h in $HARNESSES; do
  exe="$BUILD_DIR/bin/$h"
  if [ ! -x "$exe" ]; then
    summary+=("$h: not built in this configuration (skipped)")
    echo "== $h: not built in this configuration (skipped) =="
    continue
  fi
  seeds="fuzz/corpus/$h"
  mkdir -p "$work/$h/corpus" "$work/$h/artifacts"
  cp "$seeds"/* "$work/$h/corpus/"
  echo "== $h: ${TIME} s =="
  set +e
  # The temporary copy comes first: libFuzzer writes new inputs there.
  dict=()
  [ -f "fuzz/${h#fuzz_}.dict" ] && dict=(-dict="fuzz/${h#fuzz_}.dict")
  timeout $(( TIME + 300 )) "$exe" "$work/$h/corpus" "$seeds" "${dict[@]}" \
    -max_total_time="$TIME" -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=256 -print_final_stats=1 \
    -artifact_prefix="$work/$h/artifacts/" > "$work/$h/log" 2>&1
  rc=$?
  set -e
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/$h/log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$work/$h/log" | tail -1)
  corpus_size=$(find "$work/$h/corpus" -type f | wc -l)
  artifacts=$(find "$work/$h/artifacts" -type f \( -name 'crash-*' -o -name 'leak-*' -o -name 'timeout-*' -o -name 'oom-*' \) | wc -l)
  line="$h: ${execs:-?} executions (${rate:-?}/s), corpus $corpus_size inputs, exit $rc"
  summary+=("$line")
  echo "$line"
  if [ "$rc" -ne 0 ] || [ "$artifacts" -gt 0 ]; then
    failed+=("$h")
    mkdir -p "$findings_dir/$h"
    cp "$work/$h/artifacts/"* "$findings_dir/$h/" 2>/dev/null || true
    cp "$work/$h/log" "$findings_dir/$h/log.txt"
    echo "---- $h: FINDING (exit $rc, $artifacts artifact(s) in $findings_dir/$h) ----" >&2
    # The report from its first line (sanitizer, libFuzzer or an escaped
    # exception), then the input when it is short.
    first=$(grep -a -n -m 1 -E "ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)|runtime error|terminate called|==ERROR" \
      "$work/$h/log" | cut -d: -f1 || true)
    if [ -n "$first" ]; then sed -n "${first},$(( first + 40 ))p" "$work/$h/log" >&2; else tail -40 "$work/$h/log" >&2; fi
    for a in "$work/$h/artifacts/"*; do
      [ -f "$a" ] || continue
      echo "input $(basename "$a") ($(stat -c %s "$a") bytes):" >&2
      head -c 600 "$a" | cat -v >&2
      echo >&2
    done
  fi
done

echo "== fuzzing summary ($(( $(date +%s) - start )) s in all) =="
printf '%s\n' "${summary[@]}"
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz.sh: findings in: ${failed[*]} (inputs and logs in $findings_dir)" >&2
  exit 1
fi
echo "no findings"

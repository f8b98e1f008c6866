#!/bin/sh
# The Vulkan plugin's disk cache of generated fused_elementwise shaders
# (plugins/vulkan/fused.cpp), across processes: the conformance suite's
# fused_elementwise cases run three times with BACKPLANE_CACHE_DIR a fresh
# folder and BACKPLANE_LOG=0 (the plugin logs each generated shader as
# "compiled by glslang ..." or "loaded from the disk cache ...").
# 1. compiles every shader and writes one .spv per compile;
# 2. compiles none, loads each;
# 3. after one file is truncated and another overwritten with a foreign
#    shader's file: both ignored with a log line, compiled again, the rest loaded.
# Would catch: the cache never written or never read (a compile in every
# process), a non-atomic or misnamed write, a corrupt or foreign file trusted.
# Exits 77 (skipped) without a Vulkan device.
bin="$1"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cache="$dir/cache"
run() {
  BACKPLANE_LOG=0 BACKPLANE_CACHE_DIR="$cache" "$bin" conformance --plugin vulkan --filter fused_elementwise \
    --quick --quiet --compare none >"$dir/$1.log" 2>&1
  status=$?
  grep -v '^backplane \[debug\]' "$dir/$1.log"
  if grep -q "has no device available" "$dir/$1.log"; then echo "SKIPPED: no Vulkan device"; exit 77; fi
  [ $status -eq 0 ] || { echo "run $1 failed ($status)"; exit 1; }
  compiled=$(grep -c ': fused shader fused_[0-9a-f]*\(_dsc\)\?: compiled by glslang in .* written to the disk cache' "$dir/$1.log")
  loaded=$(grep -c ': fused shader fused_[0-9a-f]*\(_dsc\)\?: loaded from the disk cache' "$dir/$1.log")
  ignored=$(grep -c ': ignoring the shader cache file ' "$dir/$1.log")
  echo "run $1: compiled $compiled, loaded $loaded, ignored $ignored"
}
fail() { echo "FAILED: $*"; exit 1; }

run 1
files=$(ls "$cache"/vulkan-fused-*.spv 2>/dev/null | wc -l)
echo "cache files: $files"
[ "$compiled" -gt 0 ] || fail "run 1 compiled no shader"
[ "$files" -eq "$compiled" ] || fail "run 1 compiled $compiled shaders but left $files cache files"
ls "$cache" | grep -q '\.tmp' && fail "a temporary file was left in the cache folder"
total=$compiled

run 2
[ "$compiled" -eq 0 ] || fail "run 2 compiled $compiled shaders the cache held"
[ "$loaded" -eq "$total" ] || fail "run 2 loaded $loaded of $total shaders"

set -- "$cache"/vulkan-fused-*.spv
[ $# -ge 3 ] || fail "fewer than 3 cache files"
head -c 20 "$1" >"$dir/short" && mv "$dir/short" "$1"   # truncated
cp "$3" "$2"                                          # another shader's file under this name
run 3
[ "$ignored" -eq 2 ] || fail "run 3 ignored $ignored files, expected 2"
[ "$compiled" -eq 2 ] || fail "run 3 compiled $compiled shaders, expected 2"
[ "$loaded" -eq $((total - 2)) ] || fail "run 3 loaded $loaded, expected $((total - 2))"
grep -q 'ignoring the shader cache file .*: truncated header' "$dir/3.log" || fail "no log line for the truncated file"
grep -q 'ignoring the shader cache file .*: written for another shader' "$dir/3.log" || fail "no log line for the foreign file"
echo "ok"

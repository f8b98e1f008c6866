#!/bin/sh
# The Vulkan plugin's device-address modules through the quick conformance
# suite (BACKPLANE_VULKAN_ADDRESSING=addresses in the environment). The
# suite checks the values; this checks the path: the plugin's debug log
# names every pipeline it creates, and in address mode none may be a
# descriptor module (*_dsc), while some pipelines must have been created at
# all. Would catch: the variable ignored (every operand within
# maxStorageBufferRange then runs the _dsc twin, and the address modules go
# untested while the suite stays green).
bin="$1"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
BACKPLANE_LOG=0 "$bin" conformance --plugin vulkan --quick --quiet --compare none >"$log" 2>&1
status=$?
grep -v '^backplane \[debug\]' "$log"
made=$(grep -c ': pipeline [A-Za-z0-9_]* created in ' "$log")
dsc=$(grep -c ': pipeline [A-Za-z0-9_]*_dsc created in ' "$log")
echo "pipelines created: $made, descriptor modules among them: $dsc"
if grep -q "has no device available" "$log"; then exit $status; fi
[ "$made" -gt 0 ] || { echo "no pipeline creation in the plugin's debug log"; status=1; }
[ "$dsc" -eq 0 ] || { grep ': pipeline [A-Za-z0-9_]*_dsc created in ' "$log" | head -5; status=1; }
exit $status

#!/bin/sh
# The Vulkan plugin's GPU forms on a CPU device: lavapipe normally takes the
# direct forms of matmul and conv2d and declines scaled_dot_product_attention
# (the host runs its composed form), so the shaders a GPU runs would go
# unchecked on a machine without one. BACKPLANE_VULKAN_FORMS=gpu makes it
# take them; this runs those ops' conformance so, and checks the path: the
# plugin's debug log must name the attention and matmul workgroup pipelines
# and no direct one. Would catch: the variable ignored (the direct forms run,
# attention is declined and its shader never compiles, while the suite
# stays green).
bin="$1"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
for op in scaled_dot_product_attention matmul conv2d; do
  BACKPLANE_LOG=0 BACKPLANE_VULKAN_FORMS=gpu "$bin" conformance --plugin vulkan --quick --quiet --compare none \
    --filter "$op" >>"$log" 2>&1 || status=1
done
grep -v '^backplane \[debug\]' "$log" | grep -v '^  abi\|^  load' 
if grep -q "has no device available" "$log"; then exit $status; fi
att=$(grep -c ': pipeline attention_f32[A-Za-z0-9_]* created in ' "$log")
mm=$(grep -c ': pipeline matmul_f32[A-Za-z0-9_]* created in ' "$log")
direct=$(grep -c ': pipeline [A-Za-z0-9_]*_direct[A-Za-z0-9_]* created in ' "$log")
echo "attention pipelines: $att, matmul pipelines: $mm, direct forms among all: $direct"
[ "$att" -gt 0 ] && [ "$mm" -gt 0 ] || { echo "the GPU forms' pipelines were not created"; status=1; }
[ "$direct" -eq 0 ] || { echo "a direct form ran under BACKPLANE_VULKAN_FORMS=gpu"; status=1; }
exit $status

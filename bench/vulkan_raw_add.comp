#version 450
// The raw-Vulkan baseline's only shader (bench/vulkan_raw.cpp): c = a + b on
// 4-vectors of f32, one 4-vector per invocation, workgroup 256 — the minimal
// form of what the Vulkan plugin's binary_f32 fast path does.
layout(local_size_x = 256) in;
layout(set = 0, binding = 0, std430) readonly buffer A { vec4 a[]; };
layout(set = 0, binding = 1, std430) readonly buffer B { vec4 b[]; };
layout(set = 0, binding = 2, std430) writeonly buffer C { vec4 c[]; };
layout(push_constant) uniform PC { uint n4; } pc;

void main() {
  const uint i = gl_GlobalInvocationID.x;
  if (i < pc.n4) c[i] = a[i] + b[i];
}

#version 450
// The raw-Vulkan baseline's roofs (bench/vulkan_raw.cpp), one module, the
// mode by specialization constant:
//   MODE 0  roof_copy: c = a on 4-vectors of f32, one per invocation (the
//           device's streaming bandwidth as a compute shader sees it);
//   MODE 1  roof_fma: 4 independent vec4 FMA chains of ITERS steps per
//           invocation, the sum written out so nothing is optimised away
//           (the device's f32 FMA rate: 2 x 4 x 4 x ITERS flops an invocation).
layout(local_size_x = 256) in;
layout(constant_id = 0) const uint MODE = 0u;
layout(constant_id = 1) const int ITERS = 128;
layout(set = 0, binding = 0, std430) readonly buffer A { vec4 a[]; };
layout(set = 0, binding = 1, std430) readonly buffer B { vec4 b[]; };
layout(set = 0, binding = 2, std430) writeonly buffer C { vec4 c[]; };
layout(push_constant) uniform PC { uint n4; } pc;

void main() {
  const uint i = gl_GlobalInvocationID.x;
  if (i >= pc.n4) return;
  if (MODE == 0u) {
    c[i] = a[i];
    return;
  }
  vec4 x = a[i], y = b[i];
  vec4 s0 = x, s1 = x + 1.0, s2 = x + 2.0, s3 = x + 3.0;
  const vec4 m = vec4(0.999);
  for (int k = 0; k < ITERS; ++k) {
    s0 = fma(s0, m, y);
    s1 = fma(s1, m, y);
    s2 = fma(s2, m, y);
    s3 = fma(s3, m, y);
  }
  c[i] = s0 + s1 + s2 + s3;
}

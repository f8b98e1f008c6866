// Shared prelude of every Backplane compute shader.
//
// Binding convention (set 0, storage buffers):
//   0  per-run argument ring (int32 words); this dispatch's block starts at pc.base
//   1  device error word pair {flags, first dispatch id}, checked by synchronize()
// The op's operands are buffer-device addresses in pc.addr, "slot" k + 2 for
// operand k (dtypes.glsl), so no operand is limited by maxStorageBufferRange.
// Push constants (112 bytes, within the 128 bytes every device offers):
//   base  word offset of this dispatch's argument block in the ring
//   n     work items of the dispatch (elements, rows, ...)
//   id    dispatch number inside the command buffer, reported with errors
//   extra family-specific (row kernels: the mode; the elementwise fast path
//         is chosen by a specialization constant instead, see elementwise.glsl)
//   p[4]  family-specific (elementwise fast path: the records' offsets), so
//         the hot path reads no argument block
//   q[4]  family-specific (elementwise 2-D path: row strides, see elementwise.glsl)
//   addr[8] operand k's window start (64-byte aligned), as two uint32 words
// Layout records in the argument block are [offset, stride0..stride7] (9 words,
// int32 elements). Dims were coalesced and permuted by the host.
#extension GL_EXT_shader_16bit_storage : enable
#extension GL_EXT_shader_8bit_storage : enable
#extension GL_EXT_shader_explicit_arithmetic_types_int64 : enable
#extension GL_EXT_buffer_reference : require
#extension GL_EXT_buffer_reference_uvec2 : require

#ifndef WG
#define WG 256
#endif

layout(set = 0, binding = 0, std430) readonly buffer ArgRing { int w[]; } g_args;
layout(set = 0, binding = 1, std430) buffer ErrBuf { uint flags; uint first; } g_err;

layout(push_constant) uniform PC {
  uint base;
  uint n;
  uint id;
  uint extra;
  ivec4 p;
  ivec4 q;
  uvec2 addr[8];  // operand addresses (DECL_* in dtypes.glsl)
} pc;

int A(int i) { return g_args.w[int(pc.base) + i]; }
float Af(int i) { return intBitsToFloat(g_args.w[int(pc.base) + i]); }

// Error flags (must match exec.hpp).
#define ERR_INDEX 1u
#define ERR_DIV_ZERO 2u
#define ERR_CAST 4u
#define ERR_EMPTY 8u
void raise_error(uint code) {
  atomicOr(g_err.flags, code);
  atomicMin(g_err.first, pc.id);
}

// Linear workgroup number of a (possibly 2-D/3-D folded) grid.
uint group_linear() {
  return gl_WorkGroupID.x + gl_NumWorkGroups.x * (gl_WorkGroupID.y + gl_NumWorkGroups.y * gl_WorkGroupID.z);
}

#include "dtypes.glsl"

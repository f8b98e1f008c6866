// Storage and compute types per Backplane dtype (codes are bp_dtype values).
//   STYPE(D)  element type in a storage buffer     V4TYPE(D)  its 4-vector
//   CTYPE(D)  type arithmetic happens in           LD(D, x) / SV(D, c)  convert
// f16 and bf16 are stored as uint16_t and converted by integer code, so only
// storageBuffer16BitAccess is needed and rounding is exactly nearest-even.
// i8/u8/bool/i16 use 8/16-bit storage access and compute in int (stores wrap).
#define PASTE_(a, b) a##b
#define PASTE(a, b) PASTE_(a, b)

#define DT_F32 1
#define DT_F16 2
#define DT_BF16 3
#define DT_F64 4
#define DT_I8 5
#define DT_I16 6
#define DT_I32 7
#define DT_I64 8
#define DT_U8 9
#define DT_BOOL 10

float h2f(uint h) {
  uint s = h & 0x8000u;
  uint e = (h >> 10) & 0x1fu;
  uint m = h & 0x3ffu;
  if (e == 0u) {
    float v = float(m) * 5.9604644775390625e-8;  // subnormal: m * 2^-24, exact
    return s != 0u ? -v : v;
  }
  if (e == 31u) return uintBitsToFloat((s << 16) | 0x7f800000u | (m << 13));
  return uintBitsToFloat((s << 16) | ((e + 112u) << 23) | (m << 13));
}

// float -> f16 bits, round to nearest even, integer-only (no fast-math surprises).
uint f2h(float f) {
  uint u = floatBitsToUint(f);
  uint sign = (u >> 16) & 0x8000u;
  uint a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7e00u;
  if (a >= 0x477ff000u) return sign | 0x7c00u;
  if (a < 0x38800000u) {
    if (a < 0x33000000u) return sign;
    uint e = a >> 23;
    uint m = (a & 0x7fffffu) | 0x800000u;
    uint shift = 126u - e;
    uint r = m >> shift;
    uint rem = m & ((1u << shift) - 1u);
    uint halfway = 1u << (shift - 1u);
    if (rem > halfway || (rem == halfway && (r & 1u) != 0u)) r += 1u;
    return sign | r;
  }
  uint m = a + 0xfffu + ((a >> 13) & 1u);
  m -= 112u << 23;
  return sign | (m >> 13);
}

uint f2bf(float f) {
  uint u = floatBitsToUint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (u >> 16) | 0x40u;
  u += 0x7fffu + ((u >> 16) & 1u);
  return u >> 16;
}

#define ST_1 float
#define ST_2 uint16_t
#define ST_3 uint16_t
#define ST_4 double
#define ST_5 int8_t
#define ST_6 int16_t
#define ST_7 int
#define ST_8 int64_t
#define ST_9 uint8_t
#define ST_10 uint8_t

#define V4_1 vec4
#define V4_2 u16vec4
#define V4_3 u16vec4
#define V4_4 dvec4
#define V4_5 i8vec4
#define V4_6 i16vec4
#define V4_7 ivec4
#define V4_8 i64vec4
#define V4_9 u8vec4
#define V4_10 u8vec4

#define CT_1 float
#define CT_2 float
#define CT_3 float
#define CT_4 double
#define CT_5 int
#define CT_6 int
#define CT_7 int
#define CT_8 int64_t
#define CT_9 int
#define CT_10 int

#define LD_1(x) (x)
#define LD_2(x) h2f(uint(x))
#define LD_3(x) uintBitsToFloat(uint(x) << 16)
#define LD_4(x) (x)
#define LD_5(x) int(x)
#define LD_6(x) int(x)
#define LD_7(x) (x)
#define LD_8(x) (x)
#define LD_9(x) int(uint(x))
#define LD_10(x) int(uint(x))

#define SV_1(c) (c)
#define SV_2(c) uint16_t(f2h(c))
#define SV_3(c) uint16_t(f2bf(c))
#define SV_4(c) (c)
#define SV_5(c) int8_t(c)
#define SV_6(c) int16_t(c)
#define SV_7(c) (c)
#define SV_8(c) (c)
#define SV_9(c) uint8_t(uint(c))
#define SV_10(c) uint8_t(uint(c))

#define STYPE(D) PASTE(ST_, D)
#define V4TYPE(D) PASTE(V4_, D)
#define CTYPE(D) PASTE(CT_, D)
#define LD(D, x) PASTE(LD_, D)(x)
#define SV(D, c) PASTE(SV_, D)(c)

// Operand declarations. Each declares a global `name` with a scalar view
// `name.v[]` and, for DECL_RO/DECL_RW, `name4.v[]`, an aliased 4-vector view,
// of operand k's window (binding slot bind = k + 2; the window starts at a
// multiple of 64 bytes). Every module is built twice:
// - BP_DESC (modules <name>_dsc): the operand is a storage-buffer descriptor,
//   set 1 binding k, pushed per dispatch (VK_KHR_push_descriptor); used when
//   every operand's window lies within maxStorageBufferRange. On lavapipe a
//   streaming add runs ~1.4x faster than through addresses.
// - otherwise: a buffer reference (physical storage buffer address,
//   VK_KHR_buffer_device_address) built from pc.addr[k], so a tensor may be
//   larger than maxStorageBufferRange.
#ifdef BP_DESC
#define DECL_REF_(q, name, T, bind) layout(set = 1, binding = (bind) - 2, std430) q buffer Dsc_##name { T v[]; } name;
#else
#define DECL_REF_(q, name, T, bind)                                                        \
  layout(buffer_reference, std430, buffer_reference_align = 16) q buffer Ref_##name { T v[]; }; \
  Ref_##name name = Ref_##name(pc.addr[(bind) - 2]);
#endif
#define DECL_RO(bind, name, D) DECL_REF_(readonly, name, STYPE(D), bind) DECL_REF_(readonly, name##4, V4TYPE(D), bind)
#define DECL_RW(bind, name, D) DECL_REF_(, name, STYPE(D), bind) DECL_REF_(, name##4, V4TYPE(D), bind)
#define DECL_RO1(bind, name, D) DECL_REF_(readonly, name, STYPE(D), bind)
#define DECL_RW1(bind, name, D) DECL_REF_(, name, STYPE(D), bind)
// A buffer of a plain GLSL type T (index outputs, split-pass partials).
#define DECL_RAW(bind, name, T) DECL_REF_(, name, T, bind)
#define DECL_RAW_RO(bind, name, T) DECL_REF_(readonly, name, T, bind)

// Compute classes usable in #if: IN_FC (float compute), IN_DC (double),
// IN_LC (int64), IN_IC (int); same with OUT_.
#ifdef IN_DT
#if IN_DT == 1 || IN_DT == 2 || IN_DT == 3
#define IN_FC 1
#elif IN_DT == 4
#define IN_DC 1
#elif IN_DT == 8
#define IN_LC 1
#else
#define IN_IC 1
#endif
#if defined(IN_FC) || defined(IN_DC)
#define IN_FLOAT 1
#endif
#endif

#ifdef OUT_DT
#if OUT_DT == 1 || OUT_DT == 2 || OUT_DT == 3
#define OUT_FC 1
#elif OUT_DT == 4
#define OUT_DC 1
#elif OUT_DT == 8
#define OUT_LC 1
#else
#define OUT_IC 1
#endif
#if defined(OUT_FC) || defined(OUT_DC)
#define OUT_FLOAT 1
#endif
#endif

// Index reads: i64 indices are read as two int32 words, so indexing needs no
// 64-bit integer support.
#define DECL_IDX(bind, name) DECL_REF_(readonly, name, ivec2, bind)
// Returns the normalised index in [0, size) or -1 when out of range.
int norm_index(ivec2 v, int size) {
  int lo = v.x;
  bool ok = (v.y == 0 && lo >= 0) || (v.y == -1 && lo < 0);
  if (!ok) return -1;
  if (lo < 0) lo += size;
  if (lo < 0 || lo >= size) return -1;
  return lo;
}

// 4-element vector forms: storage 4-vector -> compute 4-vector and back.
// 8/16-bit vectors may only be loaded/stored/converted (storage-only
// features), so conversions go straight through 32-bit vectors.
vec4 h2f4(uvec4 u) { return vec4(h2f(u.x), h2f(u.y), h2f(u.z), h2f(u.w)); }
uvec4 f2h4(vec4 c) { return uvec4(f2h(c.x), f2h(c.y), f2h(c.z), f2h(c.w)); }
uvec4 f2bf4(vec4 c) { return uvec4(f2bf(c.x), f2bf(c.y), f2bf(c.z), f2bf(c.w)); }

#define C4_1 vec4
#define C4_2 vec4
#define C4_3 vec4
#define C4_4 dvec4
#define C4_5 ivec4
#define C4_6 ivec4
#define C4_7 ivec4
#define C4_8 i64vec4
#define C4_9 ivec4
#define C4_10 ivec4

#define L4_1(v) (v)
#define L4_2(v) h2f4(uvec4(v))
#define L4_3(v) uintBitsToFloat(uvec4(v) << 16)
#define L4_4(v) (v)
#define L4_5(v) ivec4(v)
#define L4_6(v) ivec4(v)
#define L4_7(v) (v)
#define L4_8(v) (v)
#define L4_9(v) ivec4(uvec4(v))
#define L4_10(v) ivec4(uvec4(v))

#define S4_1(c) (c)
#define S4_2(c) u16vec4(f2h4(c))
#define S4_3(c) u16vec4(f2bf4(c))
#define S4_4(c) (c)
#define S4_5(c) i8vec4(c)
#define S4_6(c) i16vec4(c)
#define S4_7(c) (c)
#define S4_8(c) (c)
#define S4_9(c) u8vec4(uvec4(c))
#define S4_10(c) u8vec4(uvec4(c))

#define CTYPE4(D) PASTE(C4_, D)
#define LD4(D, v) PASTE(L4_, D)(v)
#define SV4(D, c) PASTE(S4_, D)(c)

// Bit-preserving widening to a 32/64-bit type and back (select, gather).
#define RL_1(x) (x)
#define RL_2(x) uint(x)
#define RL_3(x) uint(x)
#define RL_4(x) (x)
#define RL_5(x) int(x)
#define RL_6(x) int(x)
#define RL_7(x) (x)
#define RL_8(x) (x)
#define RL_9(x) uint(x)
#define RL_10(x) uint(x)
#define RS_1(x) (x)
#define RS_2(x) uint16_t(x)
#define RS_3(x) uint16_t(x)
#define RS_4(x) (x)
#define RS_5(x) int8_t(x)
#define RS_6(x) int16_t(x)
#define RS_7(x) (x)
#define RS_8(x) (x)
#define RS_9(x) uint8_t(x)
#define RS_10(x) uint8_t(x)
#define RAWLD(D, x) PASTE(RL_, D)(x)
#define RAWSV(D, x) PASTE(RS_, D)(x)

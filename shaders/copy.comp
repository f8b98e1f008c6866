#version 450
#extension GL_GOOGLE_include_directive : require
// Strided copy with dtype conversion: contiguous (IN_DT == OUT_DT, -DSAME),
// cast, and the pieces of concat (strided output). Float->int casts of NaN,
// infinity or out-of-range values raise ERR_CAST.
#define NREC 2  // input, output
#include "common.glsl"
#include "elementwise.glsl"

layout(local_size_x = WG) in;

DECL_RO(2, a, IN_DT)
DECL_RW(3, o, OUT_DT)

#define IT CTYPE(IN_DT)
#define OT CTYPE(OUT_DT)

#ifdef IN_DC
// double -> float rounded to odd, so that a second rounding to f16/bf16 is exact.
float d2f_odd(double d) {
  float f = float(d);
  if (isinf(f) || isnan(f) || double(f) == d) return f;
  uint u = floatBitsToUint(f);
  if (abs(double(f)) > abs(d)) u -= 1u;
  return uintBitsToFloat(u | 1u);
}
#endif

#if !defined(IN_FLOAT) && (OUT_DT == DT_F16 || OUT_DT == DT_BF16)
// integer -> float rounded to odd, so that the rounding to f16/bf16 is the
// only one (a plain int -> f32 -> bf16 may round twice above 2^24): the top
// 24 significant bits, the last one set when any bit below was. Integer
// operations only: lavapipe folded uint(float(a)) == a, so a round trip
// could not tell an inexact conversion (1228931073 -> bf16 came out one
// unit low).
#ifdef IN_LC
float i2f_odd(int64_t x) {
  uint64_t a = x < 0 ? uint64_t(0) - uint64_t(x) : uint64_t(x);
  uint hi = uint(a >> 32);
  int p = hi != 0u ? 32 + findMSB(hi) : findMSB(uint(a));
  float f;
  if (p <= 23) {
    f = float(uint(a));
  } else {
    int s = p - 23;
    uint t = uint(a >> s);
    if ((a & ((uint64_t(1) << s) - uint64_t(1))) != uint64_t(0)) t |= 1u;
    f = ldexp(float(t), s);
  }
  return x < 0 ? -f : f;
}
#else
float i2f_odd(int x) {
  uint a = x < 0 ? 0u - uint(x) : uint(x);
  int p = findMSB(a);
  float f;
  if (p <= 23) {
    f = float(a);
  } else {
    int s = p - 23;
    uint t = a >> s;
    if ((a & ((1u << s) - 1u)) != 0u) t |= 1u;
    f = ldexp(float(t), s);
  }
  return x < 0 ? -f : f;
}
#endif
#endif

OT convert(IT x) {
#if OUT_DT == DT_BOOL
  return (x == IT(0)) ? 0 : 1;
#elif defined(IN_FLOAT) && defined(OUT_FLOAT)
#if defined(IN_DC) && (OUT_DT == DT_F16 || OUT_DT == DT_BF16)
  return d2f_odd(x);
#else
  return OT(x);
#endif
#elif defined(IN_FLOAT)
  // float -> integer: truncate, error when not representable.
  IT t = trunc(x);
#if OUT_DT == DT_I8
  const IT lo = IT(-128.0), hi = IT(127.0);
#elif OUT_DT == DT_I16
  const IT lo = IT(-32768.0), hi = IT(32767.0);
#elif OUT_DT == DT_U8
  const IT lo = IT(0.0), hi = IT(255.0);
#elif OUT_DT == DT_I32
  const IT lo = IT(-2147483648.0), hi = IT(2147483647.0);
#else
  const IT lo = IT(-9223372036854775808.0), hi = IT(9223372036854775807.0);
#endif
  // hi may round up to 2^31 / 2^63 in IT: require t < that bound instead.
  bool ok = !isnan(x) && t >= lo && (hi == IT(2147483647.0) || hi == IT(9223372036854775807.0) ? t < hi : t <= hi);
  if (!ok) {
    raise_error(ERR_CAST);
    return OT(0);
  }
  return OT(t);
#elif OUT_DT == DT_F16 || OUT_DT == DT_BF16
  return i2f_odd(x);
#else
  // integer -> float or integer (wraps).
  return OT(x);
#endif
}

void main() {
  const int n = int(pc.n);
  const int j = int(group_linear()) * WG + int(gl_LocalInvocationID.x);
  const int i0 = j * 4;
  if (i0 >= n) return;
  if (FAST) {
    const int oa = pc.p.x, oo = pc.p.y;
    // Elements i0 .. end-1 (a partial 4-vector only in the last invocation).
    const int end = FAST_TAIL ? min(i0 + 4, n) : i0 + 4;
    if (BCAST0) {
      // A broadcast scalar.
#ifdef SAME
      for (int i = i0; i < end; ++i) o.v[oo + i] = a.v[oa];
#else
      const OT v = convert(LD(IN_DT, a.v[oa]));
      for (int i = i0; i < end; ++i) o.v[oo + i] = SV(OUT_DT, v);
#endif
      return;
    }
    if (!FAST_TAIL || i0 + 4 <= n) {
#ifdef SAME
      o4.v[oo / 4 + j] = a4.v[oa / 4 + j];
#else
      CTYPE4(IN_DT) va = LD4(IN_DT, a4.v[oa / 4 + j]);
      CTYPE4(OUT_DT) r = CTYPE4(OUT_DT)(convert(va.x), convert(va.y), convert(va.z), convert(va.w));
      o4.v[oo / 4 + j] = SV4(OUT_DT, r);
#endif
    } else {
      for (int i = i0; i < n; ++i) {
#ifdef SAME
        o.v[oo + i] = a.v[oa + i];
#else
        o.v[oo + i] = SV(OUT_DT, convert(LD(IN_DT, a.v[oa + i])));
#endif
      }
    }
    return;
  }
  for (int c = 0; c < 4; ++c) {
    const int i = i0 + c;
    if (i >= n) break;
    int off[NREC];
    elem_offsets(i, off);
#ifdef SAME
    o.v[off[1]] = a.v[off[0]];
#else
    o.v[off[1]] = SV(OUT_DT, convert(LD(IN_DT, a.v[off[0]])));
#endif
  }
}

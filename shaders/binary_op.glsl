// The binary ops' element function, `OT op(CT x, CT y)` with OP defined by
// the includer (arithmetic 0..6: add sub mul div maximum minimum pow; with
// CMP, comparisons 0..5: eq ne lt le gt ge giving 1/0), CT/OT the compute
// types and POW where pow is wanted. binary.comp includes it once with OP
// its specialization constant; the generated fused_elementwise shaders
// (plugins/vulkan/fused.cpp) include it once per opcode with
// `#define OP <code>` and `op` renamed.
OT op(CT x, CT y) {
#ifdef CMP
  bool r;
  if (OP == 0) r = x == y;
  else if (OP == 1) r = !(x == y);
  else if (OP == 2) r = x < y;
  else if (OP == 3) r = x <= y;
  else if (OP == 4) r = x > y;
  else r = x >= y;
  return r ? 1 : 0;
#else
  if (OP == 0) return x + y;
  if (OP == 1) return x - y;
  if (OP == 2) return x * y;
#ifdef IN_FLOAT
  if (OP == 3) return x / y;
  if (OP == 4) return (isnan(x) || isnan(y)) ? x + y : max(x, y);
  if (OP == 5) return (isnan(x) || isnan(y)) ? x + y : min(x, y);
  // pow only in the _pow variants (-DPOW): lavapipe compiles every
  // pipeline of a module with all of its code, dead branches included.
#if !defined(POW)
  return x;
#elif defined(IN_FC)
  return pow_f(x, y);
#else
  return pow_d(x, y);
#endif
#else
  if (OP == 3) {
    if (y == CT(0)) {
      raise_error(ERR_DIV_ZERO);
      return CT(0);
    }
    if (y == CT(-1)) return -x;  // wraps for the minimum value instead of trapping
    return x / y;
  }
  if (OP == 4) return max(x, y);
  if (OP == 5) return min(x, y);
  return x;
#endif
#endif
}

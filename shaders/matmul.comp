#version 450
#extension GL_GOOGLE_include_directive : require
// Batched matmul C[.., M, N] = A[.., M, K] B[.., K, N] on strided A and B.
// 64x64 output tiles per workgroup (256 invocations, 4x4 outputs each), K in
// steps of 16 through shared memory. Argument block:
// [0] M [1] N [2] K [3] a_off [4] a_sm [5] a_sk [6] b_off [7] b_sk [8] b_sn
// [9] c_off [10] batch rank [11..18] batch shape [19..26] A batch strides
// [27..34] B batch strides [35..42] C batch strides. pc.n: batch count.
#include "common.glsl"

#define BM 64
#define BN 64
#define BK 16
// The direct form (DIRECT_FORM, below) runs 64 invocations per workgroup:
// its blocks are big, and a mid-size problem should still make several
// workgroups for the CPU's threads.
#ifdef DIRECT_FORM
#define DIRECT_WG 64
layout(local_size_x = DIRECT_WG) in;
#else
#define DIRECT_WG 256  // main_direct is compiled but not run here
layout(local_size_x = 256) in;
#endif

DECL_RO1(2, a, IN_DT)
DECL_RO(3, b, IN_DT)
DECL_RW1(4, c, IN_DT)

#define CT CTYPE(IN_DT)
shared CT As[BK][BM];
shared CT Bs[BK][BN];

// The direct form (-DDIRECT_FORM, modules matmul_<dtype>_direct: the host's
// choice on CPU devices such as lavapipe; a module of its own because
// lavapipe's compile time grows with all the code in a module): no shared
// memory and no barriers. Invocation g computes a
// 4x4 block of C straight from A and B (consecutive invocations take
// consecutive column blocks, so their B loads are adjacent); a CPU's caches
// do what the shared-memory tiles do on a GPU, where lavapipe's barriers and
// lane-indexed shared loads made the tiled form ~30x slower than this.

void batch_offsets(int bt, inout int ao, inout int bo, inout int co) {
  int rem = bt;
  for (int d = A(10) - 1; d >= 0; --d) {
    int s = A(11 + d);
    int q = rem / s;
    int r = rem - q * s;
    rem = q;
    ao += r * A(19 + d);
    bo += r * A(27 + d);
    co += r * A(35 + d);
  }
}

// The direct form's block of C per invocation, TM x TN (TN a multiple of 4),
// is fixed per module: register arrays sized by specialization constants
// were not kept in registers by lavapipe (2-10x slower). Specialization
// constant 0: BVEC (B's rows dense and 4-aligned, N % 4 == 0: 4-vector
// loads of B). (4-vector loads of A along K, 4 steps of K at a time, were
// ~30% slower on lavapipe: 4x the registers for A.)
#ifndef TM
#define TM 16
#endif
#ifndef TN
#define TN 16
#endif
layout(constant_id = 0) const int BVEC = 0;

void load_b(int bk, int bc[TN], int bv4[TN / 4], out CT bv[TN]) {
  if (BVEC != 0) {
    for (int j = 0; j < TN / 4; ++j) {
      const CTYPE4(IN_DT) v = LD4(IN_DT, b4.v[bv4[j] + bk / 4]);
      bv[4 * j] = v.x;
      bv[4 * j + 1] = v.y;
      bv[4 * j + 2] = v.z;
      bv[4 * j + 3] = v.w;
    }
  } else {
    for (int j = 0; j < TN; ++j) bv[j] = LD(IN_DT, b.v[bc[j] + bk]);
  }
}

void main_direct() {
  const int M = A(0), N = A(1), K = A(2);
  const int nb = (N + TN - 1) / TN, mb = (M + TM - 1) / TM;
  const int g = int(group_linear()) * DIRECT_WG + int(gl_LocalInvocationID.x);
  const int bt = g / (nb * mb);
  if (bt >= int(pc.n)) return;
  const int rest = g - bt * nb * mb;
  const int m0 = (rest / nb) * TM, n0 = (rest % nb) * TN;
  int ao = A(3), bo = A(6), co = A(9);
  batch_offsets(bt, ao, bo, co);
  const int a_sm = A(4), a_sk = A(5), b_sk = A(7), b_sn = A(8);
  int ar[TM], bc[TN];
  for (int i = 0; i < TM; ++i) ar[i] = ao + min(m0 + i, M - 1) * a_sm;  // rows past M repeat the last
  for (int j = 0; j < TN; ++j) bc[j] = bo + min(n0 + j, N - 1) * b_sn;
  // BVEC: columns past N (N % 4 == 0, so only whole 4-vectors) repeat the last 4.
  int bv4[TN / 4];
  for (int j = 0; j < TN / 4; ++j) bv4[j] = (bo + min(n0 + 4 * j, N - 4)) / 4;
  CT acc[TM][TN];
  for (int i = 0; i < TM; ++i)
    for (int j = 0; j < TN; ++j) acc[i][j] = CT(0);
  {
    int ak = 0, bk = 0;
    for (int k = 0; k < K; ++k) {
      CT av[TM], bv[TN];
      for (int i = 0; i < TM; ++i) av[i] = LD(IN_DT, a.v[ar[i] + ak]);
      load_b(bk, bc, bv4, bv);
      ak += a_sk;
      bk += b_sk;
      for (int i = 0; i < TM; ++i)
        for (int j = 0; j < TN; ++j) acc[i][j] += av[i] * bv[j];
    }
  }
  for (int i = 0; i < TM; ++i) {
    if (m0 + i >= M) break;
    for (int j = 0; j < TN; ++j)
      if (n0 + j < N) c.v[co + (m0 + i) * N + n0 + j] = SV(IN_DT, acc[i][j]);
  }
}

#ifdef DIRECT_FORM
void main() { main_direct(); }
#else
void main() {
  const int M = A(0), N = A(1), K = A(2);
  const int tiles_n = (N + BN - 1) / BN, tiles_m = (M + BM - 1) / BM;
  const int g = int(group_linear());
  const int tn = g % tiles_n;
  const int tm = (g / tiles_n) % tiles_m;
  const int bt = g / (tiles_n * tiles_m);
  if (bt >= int(pc.n)) return;
  int ao = A(3), bo = A(6), co = A(9);
  int rem = bt;
  for (int d = A(10) - 1; d >= 0; --d) {
    int s = A(11 + d);
    int q = rem / s;
    int r = rem - q * s;
    rem = q;
    ao += r * A(19 + d);
    bo += r * A(27 + d);
    co += r * A(35 + d);
  }
  const int a_sm = A(4), a_sk = A(5), b_sk = A(7), b_sn = A(8);
  const int lid = int(gl_LocalInvocationID.x);
  const int tx = lid % 16, ty = lid / 16;
  CT acc[4][4];
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 4; ++j) acc[i][j] = CT(0);
  for (int k0 = 0; k0 < K; k0 += BK) {
    for (int e = lid; e < BM * BK; e += 256) {
      int mm = e / BK, kk = e % BK;
      int gm = tm * BM + mm, gk = k0 + kk;
      As[kk][mm] = (gm < M && gk < K) ? LD(IN_DT, a.v[ao + gm * a_sm + gk * a_sk]) : CT(0);
    }
    for (int e = lid; e < BK * BN; e += 256) {
      int kk = e / BN, nn = e % BN;
      int gk = k0 + kk, gn = tn * BN + nn;
      Bs[kk][nn] = (gk < K && gn < N) ? LD(IN_DT, b.v[bo + gk * b_sk + gn * b_sn]) : CT(0);
    }
    barrier();
    for (int kk = 0; kk < BK; ++kk) {
      CT ar[4], br[4];
      for (int i = 0; i < 4; ++i) ar[i] = As[kk][ty + 16 * i];
      for (int j = 0; j < 4; ++j) br[j] = Bs[kk][tx + 16 * j];
      for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 4; ++j) acc[i][j] += ar[i] * br[j];
    }
    barrier();
  }
  for (int i = 0; i < 4; ++i) {
    int gm = tm * BM + ty + 16 * i;
    if (gm >= M) continue;
    for (int j = 0; j < 4; ++j) {
      int gn = tn * BN + tx + 16 * j;
      if (gn < N) c.v[co + gm * N + gn] = SV(IN_DT, acc[i][j]);
    }
  }
}
#endif

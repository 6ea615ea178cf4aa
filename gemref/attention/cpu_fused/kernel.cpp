// cpu_fused: jagged GDPA with a pointwise activation, fused on the CPU (gemref/attention/cpu_fused/op.py).
//
// One (sequence, head) pair at a time. Its keys and values are copied once into a local,
// zero-padded workspace (K and V transposed for the score products, K and V row-major for the
// output products); then queries go in groups (QF = 8 in the forward while NV <= 2, else
// QB = 4), keys in blocks of L lanes, and each group x L score block lives in registers from
// the Q.K^T product through the activation to the A.V product (forward) or the dV, dK, dQ
// products (backward). No score ever reaches memory.
//
// Geometry (the FLOP formula in op.py replays it): a group of consecutive queries
// covers the union of its rows' allowed key ranges, in whole L-key blocks; lanes outside a
// row's own range are computed and then zeroed. The head dim is padded with zeros to
// L * NV, NV in {1, 2, 4, 8}, so the products see only full vectors. Every entry point
// returns the number of score entries it computed (group size * L per block): tests compare
// it with the formula.
//
// Storage and precision: tensors are float32, float64 or bfloat16 in memory; bfloat16 is
// widened to float32 as it is read (exact) and rounded to nearest-even as results are written,
// so a bf16 call computes exactly what the float32 kernel computes on the widened inputs, with
// no cast passes around the kernel. Rows may be strided (q, k, v as views of one qkv
// projection): each input has its own row stride; the outputs are contiguous. float32 runs the activations as
// vector formulas (exp: Cody-Waite range reduction and a degree-6 polynomial, ~1 ulp; erfc
// from it with relative error < 1.2e-7; tanh through 1 + tanh(u) = 2 sigmoid(2u)); float64
// goes lane by lane through <cmath>.
// Vectors are GCC/Clang vector extensions: the compiler maps them to AVX-512, AVX2 or SSE.
#include "common.h"

namespace {

constexpr int QB = 4;   // queries per group in the backward (and in the forward from NV = 4)
constexpr int QF = 8;   // queries per group in the forward while NV <= 2 (registers allow it)

// ------------------------------------------------------------------------------ one pair
template <typename T, typename S, int NV>
struct Pair {
  static constexpr int D = NV * L;  // padded head dim
  static constexpr int QFWD = NV <= 2 ? QF : QB;
  typedef typename Vec<T>::type V;
  int64_t lq, lk, lkp, stride, d;   // rows, keys, keys padded to L, output row stride (H * head_dim), head_dim
  T *kT, *vT, *kr, *vr, *dkl, *dvl;  // D x lkp (transposed), lkp x D (row-major)

  // Copies this pair's keys and values into the workspace, zero-padded (keys beyond lk, dims
  // beyond d), K scaled by qk_scale. Forward: kT and V row-major (vr, scaled by out_scale).
  // Backward: kT, vT, K row-major (kr) and zeroed dK, dV accumulators (dkl, dvl).
  void prepare(const S* k, int64_t ks, const S* v, int64_t vs, T qk_scale, T out_scale, std::vector<T>& ws,
               bool grads) {
    lkp = (lk + L - 1) / L * L;
    ws.assign(size_t(D * lkp * (grads ? 5 : 2) + 64 / sizeof(T)), T(0));
    T* base = reinterpret_cast<T*>((reinterpret_cast<uintptr_t>(ws.data()) + 63) & ~uintptr_t(63));
    kT = base;
    if (!grads) {
      vr = kT + D * lkp;
      for (int64_t j = 0; j < lk; ++j)
        for (int64_t c = 0; c < d; ++c) {
          kT[c * lkp + j] = widen<T>(k[j * ks + c]) * qk_scale;
          vr[j * D + c] = widen<T>(v[j * vs + c]) * out_scale;
        }
      return;
    }
    vT = kT + D * lkp; kr = vT + D * lkp; dkl = kr + D * lkp; dvl = dkl + D * lkp;
    for (int64_t j = 0; j < lk; ++j)
      for (int64_t c = 0; c < d; ++c) {
        T kv = widen<T>(k[j * ks + c]) * qk_scale;
        kT[c * lkp + j] = kv; vT[c * lkp + j] = widen<T>(v[j * vs + c]); kr[j * D + c] = kv;
      }
  }

  // one query-side row (row stride rs), widened and zero-padded to D
  void row(const S* src, int64_t rs, int64_t i, T scale, T* dst) const {
    std::fill(dst, dst + D, T(0));
    if (i < lq) for (int64_t c = 0; c < d; ++c) dst[c] = widen<T>(src[i * rs + c]) * scale;
  }

  void write_row(S* dst, int64_t i, const V* x) const {  // the first d dims of a padded row
    alignas(64) T tmp[D];
    for (int c = 0; c < NV; ++c) store(tmp + c * L, x[c]);
    for (int64_t c = 0; c < d; ++c) dst[i * stride + c] = narrow<S>(tmp[c]);
  }

  template <int A>
  int64_t forward(const S* q, int64_t qs_, S* out, bool causal, int64_t window) const {
    int64_t entries = 0;
    alignas(64) T qs[QFWD][D], af[QFWD][L];
    for (int64_t i0 = 0; i0 < lq; i0 += QFWD) {
      Group<QFWD> g = group_at<QFWD>(i0, lq, lk, causal, window);
      V o[QFWD][NV];
      for (int r = 0; r < QFWD; ++r) {
        row(q, qs_, i0 + r, T(1), qs[r]);
        for (int c = 0; c < NV; ++c) o[r][c] = splat<V>(T(0));
      }
      for (int64_t jb = g.lo / L * L; jb < g.hi; jb += L) {
        V s[QFWD];
        for (int r = 0; r < QFWD; ++r) s[r] = splat<V>(T(0));
        for (int c = 0; c < D; ++c) {
          V kc = load<V>(kT + c * lkp + jb);
          for (int r = 0; r < QFWD; ++r) s[r] += qs[r][c] * kc;
        }
        const V j = lanes<T>(jb);
        for (int r = 0; r < QFWD; ++r) {
          V a;
          activate<T, A>(s[r], &a, nullptr);
          store(af[r], inside<T>(a, j, g.rows[r]));
        }
        for (int l = 0; l < L; ++l) {
          const T* vrow = vr + (jb + l) * D;
          for (int c = 0; c < NV; ++c) {
            V vc = load<V>(vrow + c * L);
            for (int r = 0; r < QFWD; ++r) o[r][c] += af[r][l] * vc;
          }
        }
        entries += QFWD * L;
      }
      for (int r = 0; r < g.n; ++r) write_row(out, i0 + r, o[r]);
    }
    return entries;
  }

  // dQ rows are written here; dK, dV accumulate in dkl, dvl (lkp x D, unscaled dK).
  template <int A>
  int64_t backward(const S* go, int64_t gs_, const S* q, int64_t qs_, S* dq, bool causal, int64_t window,
                   T out_scale) const {
    int64_t entries = 0;
    alignas(64) T qs[QB][D], gs[QB][D], wf[QB][L], df[QB][L];
    for (int64_t i0 = 0; i0 < lq; i0 += QB) {
      Group<QB> g = group_at<QB>(i0, lq, lk, causal, window);
      V qv[QB][NV], gv[QB][NV], dqa[QB][NV];
      for (int r = 0; r < QB; ++r) {
        row(q, qs_, i0 + r, T(1), qs[r]);
        row(go, gs_, i0 + r, out_scale, gs[r]);
        for (int c = 0; c < NV; ++c) {
          qv[r][c] = load<V>(qs[r] + c * L); gv[r][c] = load<V>(gs[r] + c * L); dqa[r][c] = splat<V>(T(0));
        }
      }
      for (int64_t jb = g.lo / L * L; jb < g.hi; jb += L) {
        V s[QB], da[QB];  // scores and dA = dO' . V
        for (int r = 0; r < QB; ++r) { s[r] = splat<V>(T(0)); da[r] = splat<V>(T(0)); }
        for (int c = 0; c < D; ++c) {
          V kc = load<V>(kT + c * lkp + jb), vc = load<V>(vT + c * lkp + jb);
          for (int r = 0; r < QB; ++r) { s[r] += qs[r][c] * kc; da[r] += gs[r][c] * vc; }
        }
        const V j = lanes<T>(jb);
        for (int r = 0; r < QB; ++r) {
          V a, dact;
          activate<T, A>(s[r], &a, &dact);
          store(wf[r], inside<T>(a, j, g.rows[r]));
          store(df[r], inside<T>(da[r] * dact, j, g.rows[r]));  // dS
        }
        for (int l = 0; l < L; ++l) {
          const int64_t at = (jb + l) * D;
          for (int c = 0; c < NV; ++c) {
            V dvc = load<V>(dvl + at + c * L), dkc = load<V>(dkl + at + c * L), kc = load<V>(kr + at + c * L);
            for (int r = 0; r < QB; ++r) {
              dvc += wf[r][l] * gv[r][c];
              dkc += df[r][l] * qv[r][c];
              dqa[r][c] += df[r][l] * kc;
            }
            store(dvl + at + c * L, dvc);
            store(dkl + at + c * L, dkc);
          }
        }
        entries += QB * L;
      }
      for (int r = 0; r < g.n; ++r) write_row(dq, i0 + r, dqa[r]);
    }
    return entries;
  }
};

template <typename S, int A, int NV, typename T = typename Compute<S>::type>
int64_t run_pairs(const Args& a, bool grads, const S* go, const S* q, const S* k, const S* v, S* out, S* dq, S* dk,
                  S* dv, T qk_scale, T out_scale) {
  std::vector<T> ws;
  int64_t entries = 0;
  const int64_t stride = a.heads * a.head_dim;
  for (int64_t p = 0; p < a.n_pairs; ++p) {
    const int64_t b = a.pairs[p] / a.heads, h = a.pairs[p] % a.heads, hd = h * a.head_dim;
    Pair<T, S, NV> pr{};
    pr.lq = a.q_offsets[b + 1] - a.q_offsets[b];
    pr.lk = a.kv_offsets[b + 1] - a.kv_offsets[b];
    pr.stride = stride;
    pr.d = a.head_dim;
    const int64_t qb = a.q_offsets[b], kb = a.kv_offsets[b];
    const int64_t qo = qb * stride + hd, ko = kb * stride + hd;   // in the contiguous outputs
    pr.prepare(k + kb * a.k_stride + hd, a.k_stride, v + kb * a.v_stride + hd, a.v_stride, qk_scale, out_scale, ws,
               grads);
    const S* qp = q + qb * a.q_stride + hd;
    if (!grads) { entries += pr.template forward<A>(qp, a.q_stride, out + qo, a.causal, a.window); continue; }
    entries += pr.template backward<A>(go + qb * a.go_stride + hd, a.go_stride, qp, a.q_stride, dq + qo, a.causal,
                                       a.window, out_scale);
    for (int64_t j = 0; j < pr.lk; ++j)
      for (int64_t c = 0; c < a.head_dim; ++c) {
        dk[ko + j * stride + c] = narrow<S>(pr.dkl[j * Pair<T, S, NV>::D + c] * qk_scale);
        dv[ko + j * stride + c] = narrow<S>(pr.dvl[j * Pair<T, S, NV>::D + c]);
      }
  }
  return entries;
}

template <typename S, int A, typename T = typename Compute<S>::type>
int64_t by_width(const Args& a, bool grads, const S* go, const S* q, const S* k, const S* v, S* out, S* dq, S* dk,
                 S* dv, T s1, T s2) {
  if (a.head_dim <= L) return run_pairs<S, A, 1>(a, grads, go, q, k, v, out, dq, dk, dv, s1, s2);
  if (a.head_dim <= 2 * L) return run_pairs<S, A, 2>(a, grads, go, q, k, v, out, dq, dk, dv, s1, s2);
  if (a.head_dim <= 4 * L) return run_pairs<S, A, 4>(a, grads, go, q, k, v, out, dq, dk, dv, s1, s2);
  if (a.head_dim <= 8 * L) return run_pairs<S, A, 8>(a, grads, go, q, k, v, out, dq, dk, dv, s1, s2);
  return -1;
}

template <typename S, typename T = typename Compute<S>::type>
int64_t dispatch(int act, const Args& a, bool grads, const S* go, const S* q, const S* k, const S* v, S* out,
                 S* dq, S* dk, S* dv, double s1, double s2) {
  switch (act) {
#define GEMREF_ACT(X) case X: return by_width<S, X>(a, grads, go, q, k, v, out, dq, dk, dv, T(s1), T(s2));
    GEMREF_EACH_ACT(GEMREF_ACT)
#undef GEMREF_ACT
    default: return -1;
  }
}

}  // namespace

// C entry points (ctypes). Tensors are (T, H, D) with contiguous (H, D) rows: the outputs
// contiguous, the inputs with the row strides given; the pairs b * H + h to compute are
// listed, so callers can split them across threads (no two pairs write the same rows). Forward
// (backward = 0) writes out; backward writes dq, dk, dv (pointers may be null when a tensor has
// no rows: test `backward`, never a pointer). Returns the score entries computed, or -1 for
// an unknown activation or a head dim above 8 * L.
#define GEMREF_ENTRY(NAME, T)                                                                          \
  extern "C" int64_t NAME(int act, int backward, const T* go, const T* q, const T* k, const T* v, T* out, \
                          T* dq, T* dk, T* dv, const int64_t* q_offsets, const int64_t* kv_offsets,       \
                          const int64_t* pairs, int64_t n_pairs, int64_t heads, int64_t head_dim,         \
                          int causal, int64_t window, double qk_scale, double out_scale,                  \
                          int64_t go_stride, int64_t q_stride, int64_t k_stride, int64_t v_stride) {      \
    Args a{q_offsets, kv_offsets, pairs, n_pairs, heads, head_dim, causal != 0, window,                \
           go_stride, q_stride, k_stride, v_stride};                                                   \
    return dispatch<T>(act, a, backward != 0, go, q, k, v, out, dq, dk, dv, qk_scale, out_scale);      \
  }
GEMREF_ENTRY(gemref_gdpa_f32, float)
GEMREF_ENTRY(gemref_gdpa_f64, double)
GEMREF_ENTRY(gemref_gdpa_bf16, bf16)

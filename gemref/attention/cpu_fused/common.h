// Shared by the cpu_fused kernels (kernel.cpp: computes in the storage dtype or float32;
// amx.cpp: bf16 products on AMX tiles): vector types, bf16 storage, the activations and
// the attention mask's geometry. Everything is in an anonymous namespace: each kernel file
// gets its own copy, so the two can be compiled with different flags into one library.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

namespace {

enum Act { SILU = 1, GELU, GELU_TANH, RELU, RELU2, LEAKY_RELU, IDENTITY };  // op.py ACT_IDS
// X(activation) for each of them: a kernel's dispatch switch is `switch (act) { GEMREF_EACH_ACT(CASE) }`
#define GEMREF_EACH_ACT(X) X(SILU) X(GELU) X(GELU_TANH) X(RELU) X(RELU2) X(LEAKY_RELU) X(IDENTITY)
constexpr int L = 16;   // lanes of a vector (float32: one AVX-512 register)

template <typename T> struct Vec;
template <> struct Vec<float> { typedef float type __attribute__((vector_size(L * 4))); };
template <> struct Vec<double> { typedef double type __attribute__((vector_size(L * 8))); };
typedef int32_t Mask32 __attribute__((vector_size(L * 4)));
typedef int64_t Mask64 __attribute__((vector_size(L * 8)));

template <typename V, typename T> inline V splat(T x) { return V{} + x; }
template <typename V, typename T> inline V load(const T* p) { V r; std::memcpy(&r, p, sizeof(V)); return r; }
template <typename V, typename T> inline void store(T* p, V x) { std::memcpy(p, &x, sizeof(V)); }

// bfloat16 in memory: the upper half of a float32's bits.
struct bf16 { uint16_t bits; };
template <typename S> struct Compute { typedef S type; };
template <> struct Compute<bf16> { typedef float type; };

template <typename T, typename S> inline T widen(S x) { return T(x); }
template <> inline float widen<float, bf16>(bf16 x) {
  uint32_t u = uint32_t(x.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
template <typename S, typename T> inline S narrow(T x) { return S(x); }
template <> inline bf16 narrow<bf16, float>(float x) {  // round to nearest even; NaN stays NaN
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{uint16_t((u >> 16) | 0x40)};
  return bf16{uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16)};
}

// ------------------------------------------------------------------------------ activations
template <typename T, int A> inline T act1(T s) {
  if constexpr (A == SILU) return s / (T(1) + std::exp(-s));
  else if constexpr (A == GELU) return T(0.5) * s * (T(1) + std::erf(s * T(0.70710678118654752440)));
  else if constexpr (A == GELU_TANH) {
    T u = T(0.79788456080286535588) * (s + T(0.044715) * s * s * s);
    return T(0.5) * s * (T(1) + std::tanh(u));
  } else if constexpr (A == RELU) return s > T(0) ? s : T(0);
  else if constexpr (A == RELU2) { T r = s > T(0) ? s : T(0); return r * r; }
  else if constexpr (A == LEAKY_RELU) return s > T(0) ? s : T(0.01) * s;
  else return s;
}

template <typename T, int A> inline T dact1(T s) {
  if constexpr (A == SILU) { T g = T(1) / (T(1) + std::exp(-s)); return g * (T(1) + s * (T(1) - g)); }
  else if constexpr (A == GELU)
    return T(0.5) * (T(1) + std::erf(s * T(0.70710678118654752440))) +
           s * std::exp(T(-0.5) * s * s) * T(0.39894228040143267794);
  else if constexpr (A == GELU_TANH) {
    const T c = T(0.79788456080286535588);
    T t = std::tanh(c * (s + T(0.044715) * s * s * s));
    return T(0.5) * (T(1) + t) + T(0.5) * s * (T(1) - t * t) * c * (T(1) + T(3 * 0.044715) * s * s);
  } else if constexpr (A == RELU) return s > T(0) ? T(1) : T(0);
  else if constexpr (A == RELU2) return s > T(0) ? T(2) * s : T(0);
  else if constexpr (A == LEAKY_RELU) return s > T(0) ? T(1) : T(0.01);
  else return T(1);
}

typedef Vec<float>::type VF;

inline VF exp_vf(VF x) {
  x = x < splat<VF>(-87.0f) ? splat<VF>(-87.0f) : x;
  x = x > splat<VF>(88.0f) ? splat<VF>(88.0f) : x;
  VF n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // round(x / ln 2)
  VF r = x - n * 0.693359375f + n * 2.12194440e-4f;                 // x - n ln 2, in two parts
  VF p = splat<VF>(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  Mask32 e = (__builtin_convertvector(n, Mask32) + 127) << 23;    // 2^n
  return p * (VF)e;
}

inline VF sigmoid_vf(VF x) { return 1.0f / (1.0f + exp_vf(-x)); }

// erfc(x), relative error < 1.2e-7 everywhere (the Chebyshev-fitted t * exp(-x^2 + P(t)),
// t = 1 / (1 + |x| / 2), of Numerical Recipes' erfcc): 1 + erf(z) = erfc(-z) keeps GELU's
// relative accuracy where 1 + erf cancels.
inline VF erfc_vf(VF x) {
  VF z = x < 0.0f ? -x : x;
  VF t = 1.0f / (1.0f + 0.5f * z);
  VF p = splat<VF>(0.17087277f);
  p = p * t - 0.82215223f;
  p = p * t + 1.48851587f;
  p = p * t - 1.13520398f;
  p = p * t + 0.27886807f;
  p = p * t - 0.18628806f;
  p = p * t + 0.09678418f;
  p = p * t + 0.37409196f;
  p = p * t + 1.00002368f;
  p = p * t - 1.26551223f;
  VF r = t * exp_vf(p - z * z);
  return x >= 0.0f ? r : 2.0f - r;
}

// a = act(s) and, when da is given, da = act'(s), for one block of L scores.
template <typename T, int A> inline void activate(typename Vec<T>::type s, typename Vec<T>::type* a,
                                                  typename Vec<T>::type* da) {
  typedef typename Vec<T>::type V;
  if constexpr (std::is_same<T, float>::value && A == SILU) {
    V g = 1.0f / (1.0f + exp_vf(-s));
    *a = s * g;
    if (da) *da = g * (1.0f + s * (1.0f - g));
  } else if constexpr (std::is_same<T, float>::value && A == GELU) {
    V c = erfc_vf(s * -0.70710678118654752f);   // 1 + erf(s / sqrt 2)
    *a = 0.5f * s * c;
    if (da) *da = 0.5f * c + s * exp_vf(-0.5f * s * s) * 0.39894228040143268f;
  } else if constexpr (std::is_same<T, float>::value && A == GELU_TANH) {
    const float k = 0.79788456080286535588f;     // sqrt(2 / pi); 1 + tanh(u) = 2 sigmoid(2u)
    V g = sigmoid_vf(2.0f * k * (s + 0.044715f * s * s * s));
    *a = s * g;
    if (da) *da = g + s * g * (1.0f - g) * 2.0f * k * (1.0f + 3.0f * 0.044715f * s * s);
  } else if constexpr (std::is_same<T, float>::value && (A == RELU || A == RELU2 || A == LEAKY_RELU || A == IDENTITY)) {
    const V z = splat<V>(0.0f), one = splat<V>(1.0f);
    if constexpr (A == RELU) { *a = s > z ? s : z; if (da) *da = s > z ? one : z; }
    else if constexpr (A == RELU2) { V r = s > z ? s : z; *a = r * r; if (da) *da = 2.0f * r; }
    else if constexpr (A == LEAKY_RELU) { *a = s > z ? s : 0.01f * s; if (da) *da = s > z ? one : splat<V>(0.01f); }
    else { *a = s; if (da) *da = one; }
  } else {  // float64: lane by lane through <cmath>
    for (int l = 0; l < L; ++l) {
      (*a)[l] = act1<T, A>(s[l]);
      if (da) (*da)[l] = dact1<T, A>(s[l]);
    }
  }
}

// What every entry point gets (the C interface of kernel.cpp and amx.cpp): the pairs b * H + h to
// compute, the offsets, the mask and the inputs' row strides.
struct Args {
  const int64_t *q_offsets, *kv_offsets, *pairs;
  int64_t n_pairs, heads, head_dim;
  bool causal;
  int64_t window;
  int64_t go_stride, q_stride, k_stride, v_stride;  // input row strides, in elements
};

// ------------------------------------------------------------------------------ geometry
struct Range { int64_t lo, hi; };

// The keys query i may attend (gemref/attention/reference.py's mask), as [lo, hi).
inline Range keys_of(int64_t i, int64_t lk, bool causal, int64_t window) {
  int64_t lo = 0, hi = lk;
  if (causal) hi = std::min(hi, i + 1);
  if (window > 0) {
    lo = std::max<int64_t>(0, i - window + 1);
    if (!causal) hi = std::min(hi, i + window);
  }
  return {lo, std::max(lo, hi)};
}

// The queries that may attend key j (the mirror of keys_of), as [lo, hi).
inline Range queries_of(int64_t j, int64_t lq, bool causal, int64_t window) {
  int64_t lo = causal ? j : 0, hi = lq;
  if (window > 0) {
    hi = std::min(hi, j + window);
    if (!causal) lo = std::max<int64_t>(0, j - window + 1);
  }
  return {lo, std::max(lo, hi)};
}

template <int Q>
struct Group {
  Range rows[Q];
  int64_t lo, hi, n;  // union of the non-empty ranges (lo >= hi: none); real rows in the group
};

template <int Q>
inline Group<Q> group_at(int64_t i0, int64_t lq, int64_t lk, bool causal, int64_t window) {
  Group<Q> g{{}, lk, 0, std::min<int64_t>(Q, lq - i0)};
  for (int r = 0; r < Q; ++r) {
    g.rows[r] = r < g.n ? keys_of(i0 + r, lk, causal, window) : Range{0, 0};
    if (g.rows[r].hi > g.rows[r].lo) { g.lo = std::min(g.lo, g.rows[r].lo); g.hi = std::max(g.hi, g.rows[r].hi); }
  }
  return g;
}

template <typename T> inline typename Vec<T>::type lanes(int64_t jb) {
  typename Vec<T>::type j;
  for (int l = 0; l < L; ++l) j[l] = T(jb + l);
  return j;
}

// x with the lanes outside [r.lo, r.hi) set to 0 (j: the lanes' key indices).
template <typename T> inline typename Vec<T>::type inside(typename Vec<T>::type x, typename Vec<T>::type j, Range r) {
  typedef typename Vec<T>::type V;
  return (j >= T(r.lo) && j < T(r.hi)) ? x : splat<V>(T(0));
}

}  // namespace

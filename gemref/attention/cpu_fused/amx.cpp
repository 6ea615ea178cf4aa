// cpu_fused on AMX: jagged GDPA with a pointwise activation in bf16, its products on Intel AMX
// tiles (gemref/attention/cpu_fused/op.py; the float32-compute kernel is kernel.cpp).
//
// An AMX tile register holds up to 16 rows of 64 bytes; TDPBF16PS C += A B multiplies a 16 x 32
// bf16 tile A by a 32 x 16 bf16 tile B stored as 16 rows of pairs ("VNNI": row p holds B[2p][n],
// B[2p+1][n] for n = 0..15) into a 16 x 16 float32 tile C. The scores and the activation stay in
// float32 (AVX-512 registers, the activations of common.h); everything a product reads is bf16.
//
// Forward, per (sequence, head): queries in blocks of TQ = 16 (one tile's rows), keys in blocks
// of TK = 32 covering the union of the block's allowed keys (as kernel.cpp, in 32-key blocks):
//   S (16 x 32, two C tiles) = Q K^T over the head dim in 32-wide chunks; A = act(qk_scale S)
//   masked, rounded to bf16 (one A tile); O (16 x dp, float32 in memory) += A V, 16 columns per
//   C tile; out = out_scale O, rounded to bf16 once.
// Backward, recomputing S, per (sequence, head): keys in blocks of 16 (tile rows), queries in
// blocks of 32 covering the union of the queries that attend any of the block's keys, so that
// every product has a tile's shape without transposing a score block:
//   S^T = K Q^T and dA^T = V dO^T (16 x 32 each, two C tiles each); A = act(qk_scale S),
//   dS = out_scale dA act'(qk_scale S), masked, rounded to bf16;
//   dV += A^T dO, dK += dS^T Q (16 keys x dp, float32 in memory);
//   dQ^T += K^T dS^T (dp x 16 queries per tile, float32 in memory; dS^T's rows paired in VNNI);
//   dq = qk_scale dQ, dk = qk_scale dK, dv = out_scale dV, each rounded to bf16 once.
// The head dim is padded with zeros to dp, a multiple of 32 (one A tile's width), at most 128.
// Every entry point returns the score entries it computed (16 x 32 per block), as kernel.cpp.
//
// Rounding: the activations (A, dS) and the inputs are bf16 where a product reads them, the
// products accumulate in float32 (TDPBF16PS), results are rounded once: FlashAttention's bf16
// recipe. Its error bound, against the float64 reference, is what tests/test_attention_cpu_fused.py
// checks.
//
// Tiles: `HwTiles` runs the AMX instructions (compiled where the compiler targets AMX-BF16:
// -march=native on such a CPU; Linux must grant the process the tile state, which the entry
// point asks for once: arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)). `SoftTiles` runs
// the same eight registers and three instructions in plain C++, on any CPU: the same kernel code
// then runs everywhere, so its logic is tested on CPUs without AMX (slowly; entry point
// gemref_gdpa_bf16_amx_emulated).
#include "common.h"

#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#define GEMREF_HW_AMX 1
#endif

namespace {

constexpr int TQ = 16;    // forward: queries per block; backward: keys per block (tile rows)
constexpr int TK = 32;    // forward: keys per block; backward: queries per block (one A tile's K)
constexpr int DC = 32;    // head-dim chunk of one A tile (32 bf16 = 64 bytes)
constexpr int NC = 16;    // columns of one C tile (16 float32 = 64 bytes)
constexpr int TILE = 512; // bf16 elements of one packed 16 x 64-byte B tile

struct TileShape { int rows, colsb; };

// ----------------------------------------------------------------------------- tiles
struct SoftTiles {
  struct State {
    TileShape shape[8];
    alignas(64) unsigned char data[8][1024];
  };
  static State& st() { static thread_local State s; return s; }
  static bool start(const TileShape* shapes) {
    for (int t = 0; t < 8; ++t) st().shape[t] = shapes[t];
    return true;
  }
  template <int T> static void zero() { std::memset(st().data[T], 0, 1024); }
  template <int T> static void load(const void* p, int64_t stride) {
    const TileShape s = st().shape[T];
    std::memset(st().data[T], 0, 1024);
    for (int r = 0; r < s.rows; ++r) std::memcpy(st().data[T] + r * 64, static_cast<const char*>(p) + r * stride, s.colsb);
  }
  template <int T> static void store(void* p, int64_t stride) {
    const TileShape s = st().shape[T];
    for (int r = 0; r < s.rows; ++r) std::memcpy(static_cast<char*>(p) + r * stride, st().data[T] + r * 64, s.colsb);
  }
  template <int C, int A, int B> static void dp() {  // TDPBF16PS C += A B
    const TileShape a = st().shape[A], c = st().shape[C];
    for (int m = 0; m < a.rows; ++m)
      for (int k = 0; k < a.colsb / 4; ++k)
        for (int n = 0; n < c.colsb / 4; ++n) {
          float* acc = reinterpret_cast<float*>(st().data[C] + m * 64) + n;
          const uint16_t* x = reinterpret_cast<const uint16_t*>(st().data[A] + m * 64) + 2 * k;
          const uint16_t* y = reinterpret_cast<const uint16_t*>(st().data[B] + k * 64) + 2 * n;
          *acc += widen<float>(bf16{x[0]}) * widen<float>(bf16{y[0]}) + widen<float>(bf16{x[1]}) * widen<float>(bf16{y[1]});
        }
  }
  static void finish() {}
};

#ifdef GEMREF_HW_AMX
struct HwTiles {
  struct alignas(64) Config {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
  };
  static bool start(const TileShape* shapes) {
    Config c{};
    c.palette = 1;
    for (int t = 0; t < 8; ++t) { c.rows[t] = uint8_t(shapes[t].rows); c.colsb[t] = uint16_t(shapes[t].colsb); }
    _tile_loadconfig(&c);
    return true;
  }
  // The tile intrinsics take the register number as a literal (it is pasted into the
  // instruction's text), hence one branch per register, and per (C, A, B) combination used.
#define GEMREF_EACH_TILE(OP) OP(0) OP(1) OP(2) OP(3) OP(4) OP(5) OP(6) OP(7)
  template <int T> static void zero() {
#define GEMREF_ZERO(N) if constexpr (T == N) _tile_zero(N);
    GEMREF_EACH_TILE(GEMREF_ZERO)
#undef GEMREF_ZERO
  }
  template <int T> static void load(const void* p, int64_t stride) {
#define GEMREF_LOAD(N) if constexpr (T == N) _tile_loadd(N, p, stride);
    GEMREF_EACH_TILE(GEMREF_LOAD)
#undef GEMREF_LOAD
  }
  template <int T> static void store(void* p, int64_t stride) {
#define GEMREF_STORE(N) if constexpr (T == N) _tile_stored(N, p, stride);
    GEMREF_EACH_TILE(GEMREF_STORE)
#undef GEMREF_STORE
  }
#undef GEMREF_EACH_TILE
  template <int C, int A, int B> static void dp() {
#define GEMREF_DP(X, Y, Z) if constexpr (C == X && A == Y && B == Z) _tile_dpbf16ps(X, Y, Z); else
    GEMREF_DP(0, 4, 5) GEMREF_DP(1, 4, 5) GEMREF_DP(2, 6, 7) GEMREF_DP(3, 6, 7) GEMREF_DP(0, 4, 6) GEMREF_DP(1, 4, 6)
    GEMREF_DP(2, 4, 6) GEMREF_DP(3, 4, 6) GEMREF_DP(0, 5, 7) static_assert(C < 0, "add this (C, A, B) to HwTiles::dp");
#undef GEMREF_DP
  }
  static void finish() { _tile_release(); }
};

// Linux hands out the AMX tile state (8 KiB per thread) only on request, once per process.
bool tiles_permitted() {
  static const bool ok = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */) == 0;
  return ok;
}
#endif

// ----------------------------------------------------------------------------- bf16 vectors
typedef Vec<float>::type VF;
typedef uint32_t VU __attribute__((vector_size(L * 4)));
typedef uint16_t VH __attribute__((vector_size(L * 2)));

inline VF widen16(const uint16_t* p) {  // 16 bf16 -> float32 (exact)
  VU u = __builtin_convertvector(load<VH>(p), VU) << 16;
  VF f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

inline VH narrow16(VF x) {  // float32 -> bf16, round to nearest even; NaN stays NaN
  VU u;
  std::memcpy(&u, &x, sizeof(u));
  VU rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  VU quiet = (u >> 16) | 0x40u;
  return __builtin_convertvector(((u & 0x7fffffffu) > 0x7f800000u) ? quiet : rounded, VH);
}

inline VF iota(int64_t first) {
  VF v;
  for (int l = 0; l < L; ++l) v[l] = float(first + l);
  return v;
}

// Rows (row stride rs elements) of a bf16 matrix, d columns, packed for B tiles; the buffer is
// zeroed first, so rows and columns beyond the matrix stay zero.
// "Column pairs": tile (block of 16 rows, chunk of 32 columns) holds, in row p, the pairs
// (x[i][2p], x[i][2p + 1]) of its 16 rows i: the transposed matrix in VNNI (as 32-bit words: a
// transpose). "Row pairs": tile (block of 32 rows, chunk of 16 columns) holds, in row p, the
// pairs (x[2p][c], x[2p + 1][c]) of its 16 columns c.
void pack_column_pairs(const uint16_t* x, int64_t rs, int64_t rows, int64_t d, int64_t dp, uint16_t* out) {
  const int64_t chunks = dp / DC, full = d / 2;
  uint32_t* o = reinterpret_cast<uint32_t*>(out);
  for (int64_t i = 0; i < rows; ++i) {
    uint32_t* dst = o + (i / TQ) * chunks * (TILE / 2) + (i % TQ);
    const uint16_t* row = x + i * rs;
    for (int64_t p = 0; p < full; ++p) {
      uint32_t w;
      std::memcpy(&w, row + 2 * p, 4);  // little-endian: column 2p in the low half
      dst[(p / 16) * (TILE / 2) + (p % 16) * 16] = w;
    }
    if (d % 2) dst[(full / 16) * (TILE / 2) + (full % 16) * 16] = row[d - 1];
  }
}

void pack_row_pairs(const uint16_t* x, int64_t rs, int64_t rows, int64_t d, int64_t dp, uint16_t* out) {
  const int64_t chunks = dp / NC;
  uint32_t* o = reinterpret_cast<uint32_t*>(out);
  for (int64_t i = 0; i < rows; i += 2) {
    const uint16_t* a = x + i * rs;
    const uint16_t* b = i + 1 < rows ? a + rs : nullptr;
    uint32_t* dst = o + (i / TK) * chunks * (TILE / 2) + ((i % TK) / 2) * 16;
    for (int64_t c = 0; c < d; ++c)
      dst[(c / NC) * (TILE / 2) + (c % NC)] = uint32_t(a[c]) | (b ? uint32_t(b[c]) << 16 : 0u);
  }
}

void copy_rows(const uint16_t* x, int64_t rs, int64_t rows, int64_t d, int64_t dp, uint16_t* out) {
  for (int64_t i = 0; i < rows; ++i) std::memcpy(out + i * dp, x + i * rs, size_t(d) * 2);
}

// dst[0:d] = bf16(scale * src[0:d]), src a float32 row padded to a multiple of 16.
void write_row(const float* src, int64_t d, float scale, uint16_t* dst) {
  for (int64_t c = 0; c < d; c += L) {
    const VH h = narrow16(load<VF>(src + c) * scale);
    std::memcpy(dst + c, &h, size_t(std::min<int64_t>(L, d - c)) * 2);
  }
}

// Whether lanes [first, first + L) miss r entirely (the activation need not run there).
inline bool outside(Range r, int64_t first) { return r.hi <= first || r.lo >= first + L; }

// A 64-byte-aligned workspace of float32 and bf16 parts, zeroed, reused across pairs.
struct Workspace {
  std::vector<unsigned char> bytes;
  size_t used = 0;
  void reset(size_t total) {
    if (bytes.size() < total + 64) bytes.resize(total + 64);
    used = 0;
    std::memset(bytes.data(), 0, total + 64);
  }
  template <typename T> T* take(size_t count) {
    uintptr_t base = (reinterpret_cast<uintptr_t>(bytes.data()) + 63) & ~uintptr_t(63);
    T* p = reinterpret_cast<T*>(base + used);
    used += (count * sizeof(T) + 63) / 64 * 64;
    return p;
  }
};

inline size_t rounded(size_t bytes) { return (bytes + 63) / 64 * 64; }

struct Pair {
  int64_t lq, lk, d, dp, stride;  // query rows, key rows, head dim, padded head dim, output row stride
  bool causal;
  int64_t window;
  float qk_scale, out_scale;
};

// ----------------------------------------------------------------------------- forward
constexpr TileShape FWD_TILES[8] = {{16, 64}, {16, 64}, {16, 64}, {16, 64}, {16, 64}, {16, 64}, {16, 64}, {16, 64}};

template <class Tiles, int A>
int64_t forward(const Pair& p, const uint16_t* q, int64_t qs, const uint16_t* k, int64_t ks, const uint16_t* v,
                int64_t vs, uint16_t* out, Workspace& ws) {
  const int64_t lk32 = (p.lk + TK - 1) / TK * TK, nd = p.dp / DC, nn = p.dp / NC;
  const bool resident = nn == 2;   // dp = 32: O lives in tiles 2 and 3 for the whole query block
  const size_t kp_n = size_t(lk32 / TQ * nd * TILE), vp_n = size_t(lk32 / TK * nn * TILE);
  ws.reset(rounded(kp_n * 2) + rounded(vp_n * 2) + rounded(TQ * p.dp * 2) + rounded(TQ * TK * 4) +
           rounded(TQ * TK * 2) + rounded(TQ * p.dp * 4));
  uint16_t *kp = ws.take<uint16_t>(kp_n), *vp = ws.take<uint16_t>(vp_n), *qb = ws.take<uint16_t>(TQ * p.dp);
  float* sbuf = ws.take<float>(TQ * TK);
  uint16_t* abuf = ws.take<uint16_t>(TQ * TK);
  float* obuf = ws.take<float>(TQ * p.dp);
  pack_column_pairs(k, ks, p.lk, p.d, p.dp, kp);
  pack_row_pairs(v, vs, p.lk, p.d, p.dp, vp);
  const VH zero{};
  int64_t entries = 0;
  for (int64_t i0 = 0; i0 < p.lq; i0 += TQ) {
    Group<TQ> g = group_at<TQ>(i0, p.lq, p.lk, p.causal, p.window);
    std::memset(qb, 0, size_t(TQ * p.dp * 2));
    std::memset(obuf, 0, size_t(TQ * p.dp * 4));
    copy_rows(q + i0 * qs, qs, g.n, p.d, p.dp, qb);
    if (resident) { Tiles::template zero<2>(); Tiles::template zero<3>(); }
    for (int64_t jb = g.lo / TK * TK; jb < g.hi; jb += TK) {
      Tiles::template zero<0>();
      Tiles::template zero<1>();
      for (int64_t c = 0; c < nd; ++c) {
        Tiles::template load<4>(qb + c * DC, p.dp * 2);
        Tiles::template load<5>(kp + ((jb / TQ) * nd + c) * TILE, 64);
        Tiles::template dp<0, 4, 5>();
        Tiles::template load<5>(kp + ((jb / TQ + 1) * nd + c) * TILE, 64);
        Tiles::template dp<1, 4, 5>();
      }
      Tiles::template store<0>(sbuf, TK * 4);
      Tiles::template store<1>(sbuf + NC, TK * 4);
      const VF j[2] = {iota(jb), iota(jb + NC)};
      for (int r = 0; r < TQ; ++r)
        for (int h = 0; h < 2; ++h) {
          uint16_t* dst = abuf + r * TK + h * NC;
          if (outside(g.rows[r], jb + h * NC)) { store(dst, zero); continue; }
          VF a;
          activate<float, A>(load<VF>(sbuf + r * TK + h * NC) * p.qk_scale, &a, nullptr);
          store(dst, narrow16(inside<float>(a, j[h], g.rows[r])));
        }
      Tiles::template load<6>(abuf, TK * 2);
      if (resident) {
        Tiles::template load<7>(vp + ((jb / TK) * nn) * TILE, 64);
        Tiles::template dp<2, 6, 7>();
        Tiles::template load<7>(vp + ((jb / TK) * nn + 1) * TILE, 64);
        Tiles::template dp<3, 6, 7>();
      } else {
        for (int64_t c = 0; c < nn; ++c) {
          Tiles::template load<2>(obuf + c * NC, p.dp * 4);
          Tiles::template load<7>(vp + ((jb / TK) * nn + c) * TILE, 64);
          Tiles::template dp<2, 6, 7>();
          Tiles::template store<2>(obuf + c * NC, p.dp * 4);
        }
      }
      entries += TQ * TK;
    }
    if (resident) { Tiles::template store<2>(obuf, p.dp * 4); Tiles::template store<3>(obuf + NC, p.dp * 4); }
    for (int64_t r = 0; r < g.n; ++r) write_row(obuf + r * p.dp, p.d, p.out_scale, out + (i0 + r) * p.stride);
  }
  return entries;
}

// ----------------------------------------------------------------------------- backward
constexpr TileShape BWD_TILES[8] = {{16, 64}, {16, 64}, {16, 64}, {16, 64}, {16, 64}, {16, 32}, {16, 64}, {8, 64}};

template <class Tiles, int A>
int64_t backward(const Pair& p, const uint16_t* go, int64_t gs, const uint16_t* q, int64_t qs, const uint16_t* k,
                 int64_t ks, const uint16_t* v, int64_t vs, uint16_t* dq, uint16_t* dk, uint16_t* dv, Workspace& ws) {
  const int64_t lk16 = (p.lk + TQ - 1) / TQ * TQ, lq32 = (p.lq + TK - 1) / TK * TK, nd = p.dp / DC, nn = p.dp / NC;
  const size_t rows_n = size_t(lk16 * p.dp), pairs_n = size_t(lq32 / TQ * nd * TILE), rowp_n = size_t(lq32 / TK * nn * TILE);
  ws.reset(3 * rounded(rows_n * 2) + 2 * rounded(pairs_n * 2) + 2 * rounded(rowp_n * 2) + rounded(size_t(p.dp * lq32) * 4) +
           2 * rounded(rows_n * 4) + 2 * rounded(TQ * TK * 4) + 3 * rounded(TQ * TK * 2));
  uint16_t *kr = ws.take<uint16_t>(rows_n), *vr = ws.take<uint16_t>(rows_n), *kt = ws.take<uint16_t>(rows_n);
  uint16_t *qd = ws.take<uint16_t>(pairs_n), *od = ws.take<uint16_t>(pairs_n);
  uint16_t *qn = ws.take<uint16_t>(rowp_n), *on = ws.take<uint16_t>(rowp_n);
  float *dqt = ws.take<float>(size_t(p.dp * lq32)), *dka = ws.take<float>(rows_n), *dva = ws.take<float>(rows_n);
  float *st = ws.take<float>(TQ * TK), *dat = ws.take<float>(TQ * TK);
  uint16_t *at = ws.take<uint16_t>(TQ * TK), *dst = ws.take<uint16_t>(TQ * TK), *dsp = ws.take<uint16_t>(TQ * TK);
  copy_rows(k, ks, p.lk, p.d, p.dp, kr);
  copy_rows(v, vs, p.lk, p.d, p.dp, vr);
  for (int64_t j = 0; j < p.lk; ++j)
    for (int64_t c = 0; c < p.d; ++c) kt[c * lk16 + j] = k[j * ks + c];
  pack_column_pairs(q, qs, p.lq, p.d, p.dp, qd);
  pack_column_pairs(go, gs, p.lq, p.d, p.dp, od);
  pack_row_pairs(q, qs, p.lq, p.d, p.dp, qn);
  pack_row_pairs(go, gs, p.lq, p.d, p.dp, on);
  const VH zero{};
  int64_t entries = 0;
  for (int64_t k0 = 0; k0 < p.lk; k0 += TQ) {
    Range cols[TQ];
    int64_t lo = p.lq, hi = 0;
    for (int r = 0; r < TQ; ++r) {
      cols[r] = k0 + r < p.lk ? queries_of(k0 + r, p.lq, p.causal, p.window) : Range{0, 0};
      if (cols[r].hi > cols[r].lo) { lo = std::min(lo, cols[r].lo); hi = std::max(hi, cols[r].hi); }
    }
    for (int64_t ib = lo / TK * TK; ib < hi; ib += TK) {
      Tiles::template zero<0>();
      Tiles::template zero<1>();
      Tiles::template zero<2>();
      Tiles::template zero<3>();
      for (int64_t c = 0; c < nd; ++c) {
        Tiles::template load<4>(kr + k0 * p.dp + c * DC, p.dp * 2);
        Tiles::template load<6>(qd + ((ib / TQ) * nd + c) * TILE, 64);
        Tiles::template dp<0, 4, 6>();
        Tiles::template load<6>(qd + ((ib / TQ + 1) * nd + c) * TILE, 64);
        Tiles::template dp<1, 4, 6>();
        Tiles::template load<4>(vr + k0 * p.dp + c * DC, p.dp * 2);
        Tiles::template load<6>(od + ((ib / TQ) * nd + c) * TILE, 64);
        Tiles::template dp<2, 4, 6>();
        Tiles::template load<6>(od + ((ib / TQ + 1) * nd + c) * TILE, 64);
        Tiles::template dp<3, 4, 6>();
      }
      Tiles::template store<0>(st, TK * 4);
      Tiles::template store<1>(st + NC, TK * 4);
      Tiles::template store<2>(dat, TK * 4);
      Tiles::template store<3>(dat + NC, TK * 4);
      const VF iq[2] = {iota(ib), iota(ib + NC)};
      for (int r = 0; r < TQ; ++r)
        for (int h = 0; h < 2; ++h) {
          uint16_t *a_dst = at + r * TK + h * NC, *ds_dst = dst + r * TK + h * NC;
          if (outside(cols[r], ib + h * NC)) { store(a_dst, zero); store(ds_dst, zero); continue; }
          VF a, dact;
          activate<float, A>(load<VF>(st + r * TK + h * NC) * p.qk_scale, &a, &dact);
          VF ds = load<VF>(dat + r * TK + h * NC) * p.out_scale * dact;
          store(a_dst, narrow16(inside<float>(a, iq[h], cols[r])));
          store(ds_dst, narrow16(inside<float>(ds, iq[h], cols[r])));
        }
      for (int r = 0; r < TQ; r += 2)       // dS^T's key rows in pairs (VNNI), per half of the queries
        for (int h = 0; h < 2; ++h) {
          const VU lo = __builtin_convertvector(load<VH>(dst + r * TK + h * NC), VU);
          const VU hi = __builtin_convertvector(load<VH>(dst + (r + 1) * TK + h * NC), VU);
          store(dsp + h * (TQ / 2) * 32 + (r / 2) * 32, lo | (hi << 16));
        }
      Tiles::template load<4>(at, TK * 2);
      for (int64_t c = 0; c < nn; ++c) {
        Tiles::template load<0>(dva + k0 * p.dp + c * NC, p.dp * 4);
        Tiles::template load<6>(on + ((ib / TK) * nn + c) * TILE, 64);
        Tiles::template dp<0, 4, 6>();
        Tiles::template store<0>(dva + k0 * p.dp + c * NC, p.dp * 4);
      }
      Tiles::template load<4>(dst, TK * 2);
      for (int64_t c = 0; c < nn; ++c) {
        Tiles::template load<0>(dka + k0 * p.dp + c * NC, p.dp * 4);
        Tiles::template load<6>(qn + ((ib / TK) * nn + c) * TILE, 64);
        Tiles::template dp<0, 4, 6>();
        Tiles::template store<0>(dka + k0 * p.dp + c * NC, p.dp * 4);
      }
      for (int h = 0; h < 2; ++h) {
        Tiles::template load<7>(dsp + h * (TQ / 2) * 32, 64);
        for (int64_t c = 0; c < nn; ++c) {
          float* acc = dqt + c * NC * lq32 + ib + h * NC;
          Tiles::template load<5>(kt + c * NC * lk16 + k0, lk16 * 2);
          Tiles::template load<0>(acc, lq32 * 4);
          Tiles::template dp<0, 5, 7>();
          Tiles::template store<0>(acc, lq32 * 4);
        }
      }
      entries += TQ * TK;
    }
  }
  for (int64_t i = 0; i < p.lq; ++i)
    for (int64_t c = 0; c < p.d; ++c) dq[i * p.stride + c] = narrow<bf16>(dqt[c * lq32 + i] * p.qk_scale).bits;
  for (int64_t j = 0; j < p.lk; ++j) {
    write_row(dka + j * p.dp, p.d, p.qk_scale, dk + j * p.stride);
    write_row(dva + j * p.dp, p.d, p.out_scale, dv + j * p.stride);
  }
  return entries;
}

// ----------------------------------------------------------------------------- all pairs
template <class Tiles, int A>
int64_t run_pairs(const Args& a, bool grads, const uint16_t* go, const uint16_t* q, const uint16_t* k,
                  const uint16_t* v, uint16_t* out, uint16_t* dq, uint16_t* dk, uint16_t* dv, float qk_scale,
                  float out_scale) {
  static thread_local Workspace ws;
  const int64_t stride = a.heads * a.head_dim;
  Tiles::start(grads ? BWD_TILES : FWD_TILES);
  int64_t entries = 0;
  for (int64_t i = 0; i < a.n_pairs; ++i) {
    const int64_t b = a.pairs[i] / a.heads, hd = (a.pairs[i] % a.heads) * a.head_dim;
    const int64_t qb = a.q_offsets[b], kb = a.kv_offsets[b];
    Pair p{a.q_offsets[b + 1] - qb, a.kv_offsets[b + 1] - kb, a.head_dim, (a.head_dim + DC - 1) / DC * DC,
           stride, a.causal, a.window, qk_scale, out_scale};
    const uint16_t *qp = q + qb * a.q_stride + hd, *kp = k + kb * a.k_stride + hd, *vp = v + kb * a.v_stride + hd;
    if (!grads) {
      entries += forward<Tiles, A>(p, qp, a.q_stride, kp, a.k_stride, vp, a.v_stride, out + qb * stride + hd, ws);
    } else {
      entries += backward<Tiles, A>(p, go + qb * a.go_stride + hd, a.go_stride, qp, a.q_stride, kp, a.k_stride, vp,
                                    a.v_stride, dq + qb * stride + hd, dk + kb * stride + hd, dv + kb * stride + hd, ws);
    }
  }
  Tiles::finish();
  return entries;
}

template <class Tiles>
int64_t dispatch(int act, const Args& a, bool grads, const uint16_t* go, const uint16_t* q, const uint16_t* k,
                 const uint16_t* v, uint16_t* out, uint16_t* dq, uint16_t* dk, uint16_t* dv, double s1, double s2) {
  if (a.head_dim < 1 || a.head_dim > 4 * DC) return -1;
  switch (act) {
#define GEMREF_ACT(X) case X: return run_pairs<Tiles, X>(a, grads, go, q, k, v, out, dq, dk, dv, float(s1), float(s2));
    GEMREF_EACH_ACT(GEMREF_ACT)
#undef GEMREF_ACT
    default: return -1;
  }
}

}  // namespace

// C entry points (ctypes), with the arguments of kernel.cpp's (bf16 tensors as uint16 bits).
// Return the score entries computed, -1 for an unknown activation or a head dim above 128, -2
// when AMX cannot run here (not compiled for it, or the OS refused the tile state).
#define GEMREF_AMX_ENTRY(NAME, TILES, READY)                                                                \
  extern "C" int64_t NAME(int act, int backward, const uint16_t* go, const uint16_t* q, const uint16_t* k,     \
                          const uint16_t* v, uint16_t* out, uint16_t* dq, uint16_t* dk, uint16_t* dv,         \
                          const int64_t* q_offsets, const int64_t* kv_offsets, const int64_t* pairs,          \
                          int64_t n_pairs, int64_t heads, int64_t head_dim, int causal, int64_t window,       \
                          double qk_scale, double out_scale, int64_t go_stride, int64_t q_stride,             \
                          int64_t k_stride, int64_t v_stride) {                                               \
    if (!(READY)) return -2;                                                                                  \
    Args a{q_offsets, kv_offsets, pairs, n_pairs, heads, head_dim, causal != 0, window,                      \
           go_stride, q_stride, k_stride, v_stride};                                                         \
    return dispatch<TILES>(act, a, backward != 0, go, q, k, v, out, dq, dk, dv, qk_scale, out_scale);       \
  }

GEMREF_AMX_ENTRY(gemref_gdpa_bf16_amx_emulated, SoftTiles, true)
#ifdef GEMREF_HW_AMX
GEMREF_AMX_ENTRY(gemref_gdpa_bf16_amx, HwTiles, tiles_permitted())
#else
extern "C" int64_t gemref_gdpa_bf16_amx(int, int, const uint16_t*, const uint16_t*, const uint16_t*, const uint16_t*,
                                        uint16_t*, uint16_t*, uint16_t*, uint16_t*, const int64_t*, const int64_t*,
                                        const int64_t*, int64_t, int64_t, int64_t, int, int64_t, double, double,
                                        int64_t, int64_t, int64_t, int64_t) {
  return -2;
}
#endif

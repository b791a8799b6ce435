// GGUF-quantized weights x float32 activations (kernels/cpu.py builds this file with cpu_kernels.cpp into
// torch.ops.pagedq_cpu), two ways. The float path (float_x) de-quantizes each weight sub-block in registers
// and multiplies it with the activations as they are, in float32 FMAs: the float32 product on the
// de-quantized weights, up to summation order. The int8 path is llama.cpp's approach: each activation row is quantized to int8 per 32-value block
// (scale d = max|x| / 127), each weight sub-block of 32 values is unpacked to int8 in registers, and the
// two meet in integer dot products (AVX2 maddubs, or AVX-512 VNNI's dpbusd where the CPU has it); a
// block's integer sums are scaled and accumulated in float32. A row's result depends on that row alone,
// never on the others in the batch, and every level (scalar, AVX2, VNNI) returns the same bits: the
// integer sums are exact, and the float work is the same operations in the same order (8 lanes, each
// the sum of 4 neighbouring products, reduced as hsum8 does). From BLOCKED_ROWS rows on, both paths run
// blocked (weight rows prepared once per block of rows, then register tiles of rows x weight rows), with
// each output's accumulation unchanged.
//
// Block layouts as ggml's (ggml-common.h); kernels/quant_reference.py de-quantizes the same bytes.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#ifdef __AVX2__
#include <immintrin.h>
#endif

namespace {

constexpr int QK = 32;  // values per activation block and per weight sub-block
constexpr int PREFETCH = 512;  // how far ahead in a weight row the fused kernels prefetch, in bytes
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define LEVEL2_AVX512  // level 2 runs the float path 16 lanes wide too
constexpr int BEST_LEVEL = 2;
#elif defined(__AVX2__)
constexpr int BEST_LEVEL = 1;
#else
constexpr int BEST_LEVEL = 0;
#endif

struct BlockQ8 {  // one 32-value block of an activation row: x ~ d * q
  float d;
  float s;  // d * sum(q): what a weight block's min multiplies
  int8_t q[QK];
};

inline float f16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
#ifdef __F16C__
  return _cvtsh_ss(h);
#else
  return c10::detail::fp16_ieee_to_fp32_value(h);
#endif
}

void quantize_row(const float* x, int64_t k, BlockQ8* out) {
  for (int64_t b = 0; b < k / QK; ++b) {
    const float* v = x + b * QK;
    float amax = 0.f;
    for (int i = 0; i < QK; ++i) amax = std::max(amax, std::fabs(v[i]));
    const float d = amax / 127.f, id = d != 0.f ? 1.f / d : 0.f;
    int sum = 0;
    for (int i = 0; i < QK; ++i) {
      const int q = static_cast<int>(std::nearbyint(v[i] * id));
      out[b].q[i] = static_cast<int8_t>(q);
      sum += q;
    }
    out[b].d = d;
    out[b].s = d * static_cast<float>(sum);
  }
}

// A weight block's float scales: sub-block j's values are sc[j][0] * w (its first 16) and sc[j][1] * w (its
// last 16), plus mterm[j] (a min, times the activation block's sum).
template <int SUBS>
struct Scales {
  float sc[SUBS][2];
  float mterm[SUBS];
};

inline void both(float* sc, float v) { sc[0] = sc[1] = v; }

// Each type: BLOCK values in BYTES bytes, SUBS = BLOCK / 32 sub-blocks; SIGNED: whether its unpacked
// values are signed (else 0..31); scales(); unpack() to 32 int8 (scalar) and, with AVX2, unpack8().
struct Q8_0 {
  static constexpr int BLOCK = 32, BYTES = 34, SUBS = 1;
  static constexpr bool SIGNED = true, HAS_MIN = false;
  static void scales(const uint8_t* b, Scales<SUBS>& s) { both(s.sc[0], f16(b)); }
  static void unpack(const uint8_t* b, int, int8_t* w) { std::memcpy(w, b + 2, QK); }
#ifdef __AVX2__
  static __m256i unpack8(const uint8_t* b, int) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 2)); }
#endif
};

#ifdef __AVX2__
inline __m256i nibbles16(const uint8_t* p) {  // 16 bytes -> their 16 low nibbles, then their 16 high ones
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(b, 4), b), _mm256_set1_epi8(0x0F));
}
inline __m256i nibbles32(const uint8_t* p, bool high) {  // 32 bytes -> their low (or high) nibbles
  const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm256_and_si256(high ? _mm256_srli_epi16(b, 4) : b, _mm256_set1_epi8(0x0F));
}
#endif

// The 4-bit types say where sub-block sub's values 0-15 and 16-31 sit: nibbles(blk, sub, at, shift) gives
// for each half the 16 bytes holding them, and 0 (low nibbles) or 4 (high); LOWEST: the unpacked value of
// nibble 0. The AVX-512 float path looks those types' values up (lookup16).
inline void both_halves(const uint8_t* bytes, const uint8_t* (&at)[2], int (&shift)[2]) {  // Q4_0, Q4_1
  at[0] = at[1] = bytes;  // byte j holds value j (low nibble) and value j + 16 (high)
  shift[0] = 0;
  shift[1] = 4;
}

struct Q4_0 {
  static constexpr int BLOCK = 32, BYTES = 18, SUBS = 1, LOWEST = -8;
  static constexpr bool SIGNED = true, HAS_MIN = false;
  static void scales(const uint8_t* b, Scales<SUBS>& s) { both(s.sc[0], f16(b)); }
  static void unpack(const uint8_t* b, int, int8_t* w) {
    for (int i = 0; i < 16; ++i) {
      w[i] = static_cast<int8_t>((b[2 + i] & 0x0F) - 8);
      w[i + 16] = static_cast<int8_t>((b[2 + i] >> 4) - 8);
    }
  }
  static void nibbles(const uint8_t* b, int, const uint8_t* (&at)[2], int (&shift)[2]) { both_halves(b + 2, at, shift); }
#ifdef __AVX2__
  static __m256i unpack8(const uint8_t* b, int) { return _mm256_sub_epi8(nibbles16(b + 2), _mm256_set1_epi8(8)); }
#endif
};

struct Q4_1 {
  static constexpr int BLOCK = 32, BYTES = 20, SUBS = 1, LOWEST = 0;
  static constexpr bool SIGNED = false, HAS_MIN = true;
  static void scales(const uint8_t* b, Scales<SUBS>& s) {
    both(s.sc[0], f16(b));
    s.mterm[0] = f16(b + 2);
  }
  static void unpack(const uint8_t* b, int, int8_t* w) {
    for (int i = 0; i < 16; ++i) {
      w[i] = static_cast<int8_t>(b[4 + i] & 0x0F);
      w[i + 16] = static_cast<int8_t>(b[4 + i] >> 4);
    }
  }
  static void nibbles(const uint8_t* b, int, const uint8_t* (&at)[2], int (&shift)[2]) { both_halves(b + 4, at, shift); }
#ifdef __AVX2__
  static __m256i unpack8(const uint8_t* b, int) { return nibbles16(b + 4); }
#endif
};

// Q4_K and Q5_K: super-blocks of 256 with float16 d and dmin, then 8 six-bit scales and mins in 12 bytes.
// Sub-block j's scale is q[j] & 63 (j < 4) or (q[j + 4] & 15) | (q[j - 4] >> 6) << 4, its min q[j + 4] & 63 or
// (q[j + 4] >> 4) | (q[j] >> 6) << 4: unpacked here four bytes at a time (as llama.cpp does), so that the
// bytes of u[0..1] are the 8 scales and those of u[2..3] the 8 mins.
inline void k_scales(const uint8_t* b, Scales<8>& s) {
  const float d = f16(b), dmin = f16(b + 2);
  constexpr uint32_t low6 = 0x3f3f3f3f, low4 = 0x0f0f0f0f, low2 = 0x03030303;
  uint32_t u[4];
  std::memcpy(u, b + 4, 12);
  u[3] = ((u[2] >> 4) & low4) | (((u[1] >> 6) & low2) << 4);
  const uint32_t first_mins = u[1] & low6;
  u[1] = (u[2] & low4) | (((u[0] >> 6) & low2) << 4);
  u[2] = first_mins;
  u[0] &= low6;
  uint8_t v[16];
  std::memcpy(v, u, 16);
  for (int j = 0; j < 8; ++j) {
    both(s.sc[j], d * static_cast<float>(v[j]));
    s.mterm[j] = -(dmin * static_cast<float>(v[8 + j]));
  }
}

struct Q4_K {
  static constexpr int BLOCK = 256, BYTES = 144, SUBS = 8, LOWEST = 0;
  static constexpr bool SIGNED = false, HAS_MIN = true;
  static void scales(const uint8_t* b, Scales<SUBS>& s) { k_scales(b, s); }
  // sub-blocks 2j and 2j + 1 share 32 bytes: the low nibbles are 2j's values, the high ones 2j + 1's
  static void nibbles(const uint8_t* b, int sub, const uint8_t* (&at)[2], int (&shift)[2]) {
    at[0] = b + 16 + 32 * (sub / 2);
    at[1] = at[0] + 16;
    shift[0] = shift[1] = sub % 2 ? 4 : 0;
  }
  static void unpack(const uint8_t* b, int sub, int8_t* w) {
    const uint8_t* qs = b + 16 + 32 * (sub / 2);
    for (int i = 0; i < QK; ++i) w[i] = static_cast<int8_t>(sub % 2 ? qs[i] >> 4 : qs[i] & 0x0F);
  }
#ifdef __AVX2__
  static __m256i unpack8(const uint8_t* b, int sub) { return nibbles32(b + 16 + 32 * (sub / 2), sub % 2); }
#endif
};

struct Q5_K {
  static constexpr int BLOCK = 256, BYTES = 176, SUBS = 8;
  static constexpr bool SIGNED = false, HAS_MIN = true;
  static void scales(const uint8_t* b, Scales<SUBS>& s) { k_scales(b, s); }
  static void unpack(const uint8_t* b, int sub, int8_t* w) {
    const uint8_t *qh = b + 16, *qs = b + 48 + 32 * (sub / 2);
    for (int i = 0; i < QK; ++i) {
      const int low = sub % 2 ? qs[i] >> 4 : qs[i] & 0x0F;
      w[i] = static_cast<int8_t>(low | (((qh[i] >> sub) & 1) << 4));
    }
  }
#ifdef __AVX2__
  static __m256i unpack8(const uint8_t* b, int sub) {
    const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 16));
    const __m256i high = _mm256_and_si256(_mm256_srli_epi16(qh, sub), _mm256_set1_epi8(1));
    return _mm256_or_si256(nibbles32(b + 48 + 32 * (sub / 2), sub % 2), _mm256_slli_epi16(high, 4));
  }
#endif
};

// Q6_K: 256 values as 4 low bits (ql, 128 bytes) and 2 high bits (qh, 64 bytes), minus 32; an int8 scale
// per 16 values; float16 d last. Sub-block j = 4h + k holds values 128h + 32k + (0..31).
struct Q6_K {
  static constexpr int BLOCK = 256, BYTES = 210, SUBS = 8;
  static constexpr bool SIGNED = true, HAS_MIN = false;
  static void scales(const uint8_t* b, Scales<SUBS>& s) {
    const float d = f16(b + 208);
    const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
    for (int j = 0; j < 8; ++j)
      for (int half = 0; half < 2; ++half) s.sc[j][half] = d * static_cast<float>(sc[2 * j + half]);
  }
  static void unpack(const uint8_t* b, int sub, int8_t* w) {
    const int h = sub / 4, k = sub % 4;
    const uint8_t *ql = b + 64 * h + 32 * (k % 2), *qh = b + 128 + 32 * h;
    for (int i = 0; i < QK; ++i) {
      const int low = k >= 2 ? ql[i] >> 4 : ql[i] & 0x0F;
      w[i] = static_cast<int8_t>((low | (((qh[i] >> (2 * k)) & 3) << 4)) - 32);
    }
  }
#ifdef __AVX2__
  static __m256i unpack8(const uint8_t* b, int sub) {
    const int h = sub / 4, k = sub % 4;
    const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 128 + 32 * h));
    const __m256i high = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * k), _mm256_set1_epi8(3));
    const __m256i q = _mm256_or_si256(nibbles32(b + 64 * h + 32 * (k % 2), k >= 2), _mm256_slli_epi16(high, 4));
    return _mm256_sub_epi8(q, _mm256_set1_epi8(32));
  }
#endif
};

inline float reduce8(const float* a) { return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7])); }

// out[r] = weight row . activation row r, for R rows; the scalar reference every SIMD level equals.
template <class W, int R>
void dot_scalar(const uint8_t* wrow, int64_t blocks, const BlockQ8* const* x, float* out) {
  float acc[R][8] = {}, macc[R] = {};
  int8_t w[QK];
  Scales<W::SUBS> s;
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* blk = wrow + b * W::BYTES;
    W::scales(blk, s);
    for (int sub = 0; sub < W::SUBS; ++sub) {
      W::unpack(blk, sub, w);
      for (int r = 0; r < R; ++r) {
        const BlockQ8& xq = x[r][b * W::SUBS + sub];
        for (int lane = 0; lane < 8; ++lane) {
          int32_t sum = 0;
          for (int i = 4 * lane; i < 4 * lane + 4; ++i) sum += int32_t(w[i]) * int32_t(xq.q[i]);
          acc[r][lane] = std::fma(s.sc[sub][lane / 4] * xq.d, static_cast<float>(sum), acc[r][lane]);
        }
        if constexpr (W::HAS_MIN) macc[r] += s.mterm[sub] * xq.s;
      }
    }
  }
  for (int r = 0; r < R; ++r) out[r] = reduce8(acc[r]) + macc[r];
}

#ifdef __AVX2__
inline float hsum8(__m256 v) {
  const __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 q = _mm_add_ps(h, _mm_movehl_ps(h, h));
  return _mm_cvtss_f32(_mm_add_ss(q, _mm_movehdup_ps(q)));
}

// 8 lanes, each the sum of 4 neighbouring u8 x s8 products (no int16 saturation: |w| <= 128, |x| <= 127).
template <bool VNNI>
inline __m256i dot4(__m256i u, __m256i s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  if constexpr (VNNI) return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
#endif
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

template <class W, int R, bool VNNI>
void dot_avx2(const uint8_t* wrow, int64_t blocks, const BlockQ8* const* x, float* out) {
  __m256 acc[R];
  float macc[R] = {};
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  Scales<W::SUBS> s;
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* blk = wrow + b * W::BYTES;
    W::scales(blk, s);
    _mm_prefetch(reinterpret_cast<const char*>(blk + PREFETCH), _MM_HINT_T0);
    for (int sub = 0; sub < W::SUBS; ++sub) {
      const __m256i w = W::unpack8(blk, sub);
      const __m256i magnitude = W::SIGNED ? _mm256_sign_epi8(w, w) : w;
      const __m256 sc = _mm256_set_m128(_mm_set1_ps(s.sc[sub][1]), _mm_set1_ps(s.sc[sub][0]));
      for (int r = 0; r < R; ++r) {
        const BlockQ8& xq = x[r][b * W::SUBS + sub];
        __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq.q));
        if constexpr (W::SIGNED) xv = _mm256_sign_epi8(xv, w);
        const __m256 sums = _mm256_cvtepi32_ps(dot4<VNNI>(magnitude, xv));
        acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(sc, _mm256_set1_ps(xq.d)), sums, acc[r]);
        if constexpr (W::HAS_MIN) macc[r] += s.mterm[sub] * xq.s;
      }
    }
  }
  for (int r = 0; r < R; ++r) out[r] = hsum8(acc[r]) + macc[r];
}
#endif

template <class W, int R>
void dot_rows(int level, const uint8_t* wrow, int64_t blocks, const BlockQ8* const* x, float* out) {
#ifdef __AVX2__
  if (level == 2) return dot_avx2<W, R, true>(wrow, blocks, x, out);
  if (level == 1) return dot_avx2<W, R, false>(wrow, blocks, x, out);
#endif
  dot_scalar<W, R>(wrow, blocks, x, out);
}

constexpr int TILE = 4;  // activation rows per pass over a weight row

// --- The float path: weights de-quantized in registers, times float32 activations (no activation rounding).
// A sub-block's 32 values are de-quantized as kernels/quant_reference.py does (scale * q, then + min: the
// same bits), in four chunks of 8; each activation row keeps two 8-lane accumulators (chunks 0 and 2 in one,
// 1 and 3 in the other), and the row's result is their sum reduced as hsum8 does: a fixed order, whatever
// the row count, and the same at every level (std::fma is the AVX2 FMA's rounding).
template <class W, int R>
void fdot_scalar(const uint8_t* wrow, int64_t blocks, const float* const* x, float* out) {
  float acc[R][2][8] = {};
  int8_t q[QK];
  float w[QK];
  Scales<W::SUBS> s;
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* blk = wrow + b * W::BYTES;
    W::scales(blk, s);
    for (int sub = 0; sub < W::SUBS; ++sub) {
      W::unpack(blk, sub, q);
      for (int i = 0; i < QK; ++i) {
        w[i] = s.sc[sub][i / 16] * static_cast<float>(q[i]);
        if constexpr (W::HAS_MIN) w[i] = w[i] + s.mterm[sub];
      }
      const int64_t at = (b * W::SUBS + sub) * QK;
      for (int r = 0; r < R; ++r)
        for (int i = 0; i < QK; ++i) acc[r][(i / 8) % 2][i % 8] = std::fma(w[i], x[r][at + i], acc[r][(i / 8) % 2][i % 8]);
    }
  }
  for (int r = 0; r < R; ++r) {
    float sum[8];
    for (int lane = 0; lane < 8; ++lane) sum[lane] = acc[r][0][lane] + acc[r][1][lane];
    out[r] = reduce8(sum);
  }
}

#ifdef __AVX2__
// Sub-block sub of a weight block, de-quantized to 4 x 8 floats (scale * q, then + min).
template <class W>
inline void dequant_sub(const uint8_t* blk, int sub, const Scales<W::SUBS>& s, __m256* w) {
  const __m256i q = W::unpack8(blk, sub);
  const __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
  const __m128i bytes[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
  for (int c = 0; c < 4; ++c) {
    w[c] = _mm256_mul_ps(_mm256_set1_ps(s.sc[sub][c / 2]), _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes[c])));
    if constexpr (W::HAS_MIN) w[c] = _mm256_add_ps(w[c], _mm256_set1_ps(s.mterm[sub]));
  }
}

template <class W, int R>
void fdot_avx2(const uint8_t* wrow, int64_t blocks, const float* const* x, float* out) {
  __m256 acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  Scales<W::SUBS> s;
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* blk = wrow + b * W::BYTES;
    W::scales(blk, s);
    _mm_prefetch(reinterpret_cast<const char*>(blk + PREFETCH), _MM_HINT_T0);
    for (int sub = 0; sub < W::SUBS; ++sub) {
      __m256 w[4];
      dequant_sub<W>(blk, sub, s, w);
      const int64_t at = (b * W::SUBS + sub) * QK;
      for (int r = 0; r < R; ++r)
        for (int c = 0; c < 4; ++c) acc[r][c % 2] = _mm256_fmadd_ps(w[c], _mm256_loadu_ps(x[r] + at + 8 * c), acc[r][c % 2]);
    }
  }
  for (int r = 0; r < R; ++r) out[r] = hsum8(_mm256_add_ps(acc[r][0], acc[r][1]));
}
#endif

#ifdef LEVEL2_AVX512
inline float hsum16(__m512 v) {  // fdot_avx2's two accumulators, side by side, summed as it sums them
  const __m256 high = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
  return hsum8(_mm256_add_ps(_mm512_castps512_ps256(v), high));
}

// Sub-block sub de-quantized to 2 x 16 floats, the same bits as dequant_sub's chunks 0-1 and 2-3.
template <class W>
inline void dequant_sub16(const uint8_t* blk, int sub, const Scales<W::SUBS>& s, __m512* w) {
  const __m256i q = W::unpack8(blk, sub);
  const __m128i halves[2] = {_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1)};
  for (int h = 0; h < 2; ++h) {
    w[h] = _mm512_mul_ps(_mm512_set1_ps(s.sc[sub][h]), _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(halves[h])));
    if constexpr (W::HAS_MIN) w[h] = _mm512_add_ps(w[h], _mm512_set1_ps(s.mterm[sub]));
  }
}

template <class W, class = void>
struct Nibbles : std::false_type {};  // a 4-bit type (it has W::LOWEST and W::nibbles)
template <class W>
struct Nibbles<W, std::void_t<decltype(W::LOWEST)>> : std::true_type {};

// dequant_sub16 for Nibbles types: the sub-block's 16 possible values de-quantized once (scale * q, then
// + min: the same operations on the same values, so the same bits), then looked up per nibble (vpermps
// reads the low 4 bits of each index lane: a byte's low nibble as it is, its high one shifted down). Two
// lookups per 32 values where dequant_sub16 converts, scales and shifts each value. One scale per
// sub-block (s.sc[sub][0] == s.sc[sub][1] for these types).
template <class W>
inline void lookup16(const uint8_t* blk, int sub, const Scales<W::SUBS>& s, __m512* w) {
  const __m512 q = _mm512_add_ps(_mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                 _mm512_set1_ps(static_cast<float>(W::LOWEST)));  // exact: small integers
  __m512 values = _mm512_mul_ps(_mm512_set1_ps(s.sc[sub][0]), q);
  if constexpr (W::HAS_MIN) values = _mm512_add_ps(values, _mm512_set1_ps(s.mterm[sub]));
  const uint8_t* at[2];
  int shift[2];
  W::nibbles(blk, sub, at, shift);
  for (int h = 0; h < 2; ++h) {
    const __m512i bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(at[h])));
    w[h] = _mm512_permutexvar_ps(_mm512_srl_epi32(bytes, _mm_cvtsi32_si128(shift[h])), values);
  }
}

// fdot_avx2 16 lanes wide: lanes 0-7 are its first accumulator (chunks 0 and 2 of each sub-block), lanes
// 8-15 its second (chunks 1 and 3), each lane fed the same products in the same order: the same bits.
template <class W, int R>
void fdot_avx512(const uint8_t* wrow, int64_t blocks, const float* const* x, float* out) {
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  Scales<W::SUBS> s;
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* blk = wrow + b * W::BYTES;
    W::scales(blk, s);
    _mm_prefetch(reinterpret_cast<const char*>(blk + PREFETCH), _MM_HINT_T0);
    for (int sub = 0; sub < W::SUBS; ++sub) {
      __m512 w[2];
      if constexpr (Nibbles<W>::value)
        lookup16<W>(blk, sub, s, w);
      else
        dequant_sub16<W>(blk, sub, s, w);
      const int64_t at = (b * W::SUBS + sub) * QK;
      for (int r = 0; r < R; ++r)
        for (int h = 0; h < 2; ++h) acc[r] = _mm512_fmadd_ps(w[h], _mm512_loadu_ps(x[r] + at + 16 * h), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) out[r] = hsum16(acc[r]);
}
#endif

template <class W, int R>
void fdot_rows(int level, const uint8_t* wrow, int64_t blocks, const float* const* x, float* out) {
#ifdef LEVEL2_AVX512
  if (level == 2) return fdot_avx512<W, R>(wrow, blocks, x, out);
#endif
#ifdef __AVX2__
  if (level >= 1) return fdot_avx2<W, R>(wrow, blocks, x, out);
#endif
  fdot_scalar<W, R>(wrow, blocks, x, out);
}

#ifdef __AVX2__
// --- The blocked form of both paths, for many rows: each weight row is prepared once per block of rows
// (de-quantized to floats, or unpacked to int8 sub-blocks with their scales), and a register tile of
// activation rows x weight rows multiplies the prepared rows: FR x FN with 16 registers (AVX2), WR x WN with
// AVX-512's 32 (each k step's loads then feed twice the FMAs). Each output keeps the fused kernels'
// accumulators and order (fdot_avx2's, dot_avx2's), so a row's bits depend neither on the path, nor on
// its tile, nor on its batch.
constexpr int FR = 3, FN = 2, WR = 4, WN = 4;

// A weight row de-quantized to floats (WIDE: 16 values at a time, as fdot_avx512 does: the same bits).
template <class W, bool WIDE>
void dequant_row(const uint8_t* wrow, int64_t blocks, float* out) {
  Scales<W::SUBS> s;
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* blk = wrow + b * W::BYTES;
    W::scales(blk, s);
    for (int sub = 0; sub < W::SUBS; ++sub) {
      float* dst = out + (b * W::SUBS + sub) * QK;
#ifdef LEVEL2_AVX512
      if constexpr (WIDE) {
        __m512 w[2];
        if constexpr (Nibbles<W>::value)
          lookup16<W>(blk, sub, s, w);
        else
          dequant_sub16<W>(blk, sub, s, w);
        for (int h = 0; h < 2; ++h) _mm512_storeu_ps(dst + 16 * h, w[h]);
        continue;
      }
#endif
      __m256 w[4];
      dequant_sub<W>(blk, sub, s, w);
      for (int c = 0; c < 4; ++c) _mm256_storeu_ps(dst + 8 * c, w[c]);
    }
  }
}

// out[r][n] = x[r] . w[n] over k floats, as fdot_avx2 sums them.
void ftile_avx2(const float* const* w, const float* const* x, int64_t k, float (*out)[FN]) {
  __m256 acc[FR][FN][2];
  for (auto& row : acc)
    for (auto& pair : row) pair[0] = pair[1] = _mm256_setzero_ps();
  for (int64_t at = 0; at < k; at += QK)
    for (int c = 0; c < 4; ++c) {
      __m256 wv[FN];
      for (int n = 0; n < FN; ++n) wv[n] = _mm256_loadu_ps(w[n] + at + 8 * c);
      for (int r = 0; r < FR; ++r) {
        const __m256 xv = _mm256_loadu_ps(x[r] + at + 8 * c);
        for (int n = 0; n < FN; ++n) acc[r][n][c % 2] = _mm256_fmadd_ps(wv[n], xv, acc[r][n][c % 2]);
      }
    }
  for (int r = 0; r < FR; ++r)
    for (int n = 0; n < FN; ++n) out[r][n] = hsum8(_mm256_add_ps(acc[r][n][0], acc[r][n][1]));
}

#ifdef LEVEL2_AVX512
// ftile_avx2 16 lanes wide (lanes as in fdot_avx512): the same bits.
void ftile_avx512(const float* const* w, const float* const* x, int64_t k, float (*out)[WN]) {
  __m512 acc[WR][WN];
  for (auto& row : acc)
    for (auto& one : row) one = _mm512_setzero_ps();
  for (int64_t at = 0; at < k; at += 16) {
    __m512 wv[WN];
    for (int n = 0; n < WN; ++n) wv[n] = _mm512_loadu_ps(w[n] + at);
    for (int r = 0; r < WR; ++r) {
      const __m512 xv = _mm512_loadu_ps(x[r] + at);
      for (int n = 0; n < WN; ++n) acc[r][n] = _mm512_fmadd_ps(wv[n], xv, acc[r][n]);
    }
  }
  for (int r = 0; r < WR; ++r)
    for (int n = 0; n < WN; ++n) out[r][n] = hsum16(acc[r][n]);
}
#endif

struct SubBlock {  // a weight sub-block unpacked: values sc[0] * q (first 16), sc[1] * q (last 16), + mterm
  int8_t q[QK];
  float sc[2];
  float mterm;
};

template <class W>
void unpack_row(const uint8_t* wrow, int64_t blocks, SubBlock* out) {
  Scales<W::SUBS> s;
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* blk = wrow + b * W::BYTES;
    W::scales(blk, s);
    for (int sub = 0; sub < W::SUBS; ++sub) {
      SubBlock& o = out[b * W::SUBS + sub];
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(o.q), W::unpack8(blk, sub));
      o.sc[0] = s.sc[sub][0];
      o.sc[1] = s.sc[sub][1];
      o.mterm = W::HAS_MIN ? s.mterm[sub] : 0.f;
    }
  }
}

// out[r][n] = x[r] . w[n] over subs sub-blocks, as dot_avx2 sums them.
template <class W, bool VNNI>
void itile_avx2(const SubBlock* const* w, const BlockQ8* const* x, int64_t subs, float (*out)[FN]) {
  __m256 acc[FR][FN];
  float macc[FR][FN] = {};
  for (auto& row : acc)
    for (auto& a : row) a = _mm256_setzero_ps();
  for (int64_t j = 0; j < subs; ++j) {
    __m256i wv[FN], magnitude[FN];
    __m256 sc[FN];
    for (int n = 0; n < FN; ++n) {
      wv[n] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[n][j].q));
      magnitude[n] = W::SIGNED ? _mm256_sign_epi8(wv[n], wv[n]) : wv[n];
      sc[n] = _mm256_set_m128(_mm_set1_ps(w[n][j].sc[1]), _mm_set1_ps(w[n][j].sc[0]));
    }
    for (int r = 0; r < FR; ++r) {
      const BlockQ8& xq = x[r][j];
      const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq.q));
      for (int n = 0; n < FN; ++n) {
        const __m256i xs = W::SIGNED ? _mm256_sign_epi8(xv, wv[n]) : xv;
        const __m256 sums = _mm256_cvtepi32_ps(dot4<VNNI>(magnitude[n], xs));
        acc[r][n] = _mm256_fmadd_ps(_mm256_mul_ps(sc[n], _mm256_set1_ps(xq.d)), sums, acc[r][n]);
        if constexpr (W::HAS_MIN) macc[r][n] += w[n][j].mterm * xq.s;
      }
    }
  }
  for (int r = 0; r < FR; ++r)
    for (int n = 0; n < FN; ++n) out[r][n] = hsum8(acc[r][n]) + macc[r][n];
}

// Activation rows [m0, m1) (row m at x + m * x_len) times the prepared weight rows panel[0 .. nn) (each
// p_len apart): out[m, col + n]. A short tile repeats its last row or column and drops those results.
template <int TR, int TN, class P, class X, class Tile>
void panel_rows(const P* panel, int64_t p_len, int64_t nn, const X* x, int64_t x_len, int64_t m0, int64_t m1,
                Tile tile, float* out, int64_t ldo, int64_t col) {
  const P* w[TN];
  for (int n = 0; n < TN; ++n) w[n] = panel + std::min<int64_t>(n, nn - 1) * p_len;
  const X* rows[TR];
  float dots[TR][TN];
  for (int64_t m = m0; m < m1; m += TR) {
    for (int r = 0; r < TR; ++r) rows[r] = x + std::min<int64_t>(m + r, m1 - 1) * x_len;
    tile(w, rows, dots);
    for (int64_t r = 0; r < std::min<int64_t>(TR, m1 - m); ++r)
      for (int64_t n = 0; n < nn; ++n) out[(m + r) * ldo + col + n] = dots[r][n];
  }
}

// Weight rows [begin, end) against all m_rows activation rows, row_block at a time: rows whose activations
// (about 128 KiB) stay in L2 while each panel of TN prepared weight rows passes over them in TR x TN tiles.
template <int TR, int TN, class P, class X, class Prepare, class Tile>
void blocked(const uint8_t* w, int64_t row_bytes, int64_t p_len, const X* x, int64_t x_len, int64_t x_bytes,
             int64_t m_rows, Prepare prepare, Tile tile, float* out, int64_t ldo, int64_t col0, int64_t begin,
             int64_t end) {
  const int64_t row_block = std::max<int64_t>(TR, (128 * 1024 / x_bytes) / TR * TR);
  std::vector<P> panel(TN * p_len);
  for (int64_t m0 = 0; m0 < m_rows; m0 += row_block) {
    const int64_t m1 = std::min(m_rows, m0 + row_block);
    for (int64_t n = begin; n < end; n += TN) {
      const int64_t nn = std::min<int64_t>(TN, end - n);
      for (int64_t i = 0; i < nn; ++i) prepare(w + (n + i) * row_bytes, panel.data() + i * p_len);
      panel_rows<TR, TN>(panel.data(), p_len, nn, x, x_len, m0, m1, tile, out, ldo, col0 + n);
    }
  }
}

template <class W, bool WIDE>
void fmatmul_blocked(const uint8_t* w, int64_t row_bytes, const float* xf, int64_t m_rows, int64_t k, float* out,
                     int64_t ldo, int64_t col0, int64_t begin, int64_t end) {
  const int64_t blocks = row_bytes / W::BYTES;
  auto prepare = [blocks](const uint8_t* wrow, float* dst) { dequant_row<W, WIDE>(wrow, blocks, dst); };
#ifdef LEVEL2_AVX512
  if constexpr (WIDE) {
    auto tile = [k](const float* const* wr, const float* const* xr, float (*dots)[WN]) { ftile_avx512(wr, xr, k, dots); };
    return blocked<WR, WN, float>(w, row_bytes, k, xf, k, k * 4, m_rows, prepare, tile, out, ldo, col0, begin, end);
  }
#endif
  auto tile = [k](const float* const* wr, const float* const* xr, float (*dots)[FN]) { ftile_avx2(wr, xr, k, dots); };
  blocked<FR, FN, float>(w, row_bytes, k, xf, k, k * 4, m_rows, prepare, tile, out, ldo, col0, begin, end);
}

template <class W, bool VNNI>
void matmul_blocked(const uint8_t* w, int64_t row_bytes, const BlockQ8* xq, int64_t m_rows, int64_t x_blocks,
                    float* out, int64_t ldo, int64_t col0, int64_t begin, int64_t end) {
  const int64_t blocks = row_bytes / W::BYTES;
  auto prepare = [blocks](const uint8_t* wrow, SubBlock* dst) { unpack_row<W>(wrow, blocks, dst); };
  auto tile = [x_blocks](const SubBlock* const* wr, const BlockQ8* const* xr, float (*dots)[FN]) {
    itile_avx2<W, VNNI>(wr, xr, x_blocks, dots);
  };
  blocked<FR, FN, SubBlock>(w, row_bytes, x_blocks, xq, x_blocks, x_blocks * int64_t(sizeof(BlockQ8)), m_rows, prepare,
                    tile, out, ldo, col0, begin, end);
}
#endif

// Fewer rows than this run fused (de-quantized in registers per tile of TILE rows), more run blocked.
constexpr int64_t BLOCKED_ROWS = 5;

template <int R>
using Rows = std::integral_constant<int, R>;

// The fused path: weight rows [begin, end), each against the activation rows (row m at x0 + m * x_len) up
// to TILE at a time; dot(Rows<r>, wrow, blocks, x, dots) is one type's kernel at the caller's level.
template <class W, class X, class Dot>
void fused_rows(const uint8_t* w, int64_t row_bytes, const X* x0, int64_t x_len, int64_t m_rows, Dot dot,
                float* out, int64_t ldo, int64_t col0, int64_t begin, int64_t end) {
  const int64_t blocks = row_bytes / W::BYTES;
  const X* x[TILE];
  float dots[TILE];
  for (int64_t n = begin; n < end; ++n) {
    const uint8_t* wrow = w + n * row_bytes;
    for (int64_t m = 0; m < m_rows; m += TILE) {
      const int64_t r = std::min<int64_t>(TILE, m_rows - m);
      for (int64_t i = 0; i < r; ++i) x[i] = x0 + (m + i) * x_len;
      switch (r) {
        case 4: dot(Rows<4>{}, wrow, blocks, x, dots); break;
        case 3: dot(Rows<3>{}, wrow, blocks, x, dots); break;
        case 2: dot(Rows<2>{}, wrow, blocks, x, dots); break;
        default: dot(Rows<1>{}, wrow, blocks, x, dots);
      }
      for (int64_t i = 0; i < r; ++i) out[(m + i) * ldo + col0 + n] = dots[i];
    }
  }
}

template <class W>
void fmatmul_rows(int level, const uint8_t* w, int64_t row_bytes, const float* xf, int64_t m_rows, int64_t k,
                  float* out, int64_t ldo, int64_t col0, int64_t begin, int64_t end) {
#ifdef __AVX2__
  if (level == 2 && m_rows >= BLOCKED_ROWS)
    return fmatmul_blocked<W, true>(w, row_bytes, xf, m_rows, k, out, ldo, col0, begin, end);
  if (level == 1 && m_rows >= BLOCKED_ROWS)
    return fmatmul_blocked<W, false>(w, row_bytes, xf, m_rows, k, out, ldo, col0, begin, end);
#endif
  auto dot = [level](auto rows, const uint8_t* wrow, int64_t blocks, const float* const* x, float* dots) {
    fdot_rows<W, decltype(rows)::value>(level, wrow, blocks, x, dots);
  };
  fused_rows<W>(w, row_bytes, xf, k, m_rows, dot, out, ldo, col0, begin, end);
}

// out[m, col0 + n] = x[m] . w[n] for one weight of type W, rows [begin, end).
template <class W>
void matmul_rows(int level, const uint8_t* w, int64_t row_bytes, const BlockQ8* xq, int64_t m_rows,
                 int64_t x_blocks, float* out, int64_t ldo, int64_t col0, int64_t begin, int64_t end) {
#ifdef __AVX2__
  if (level == 2 && m_rows >= BLOCKED_ROWS)
    return matmul_blocked<W, true>(w, row_bytes, xq, m_rows, x_blocks, out, ldo, col0, begin, end);
  if (level == 1 && m_rows >= BLOCKED_ROWS)
    return matmul_blocked<W, false>(w, row_bytes, xq, m_rows, x_blocks, out, ldo, col0, begin, end);
#endif
  auto dot = [level](auto rows, const uint8_t* wrow, int64_t blocks, const BlockQ8* const* x, float* dots) {
    dot_rows<W, decltype(rows)::value>(level, wrow, blocks, x, dots);
  };
  fused_rows<W>(w, row_bytes, xq, x_blocks, m_rows, dot, out, ldo, col0, begin, end);
}

using MatmulRows = void (*)(int, const uint8_t*, int64_t, const BlockQ8*, int64_t, int64_t, float*, int64_t,
                            int64_t, int64_t, int64_t);

using FMatmulRows = void (*)(int, const uint8_t*, int64_t, const float*, int64_t, int64_t, float*, int64_t,
                             int64_t, int64_t, int64_t);

struct Kind {
  MatmulRows run;      // int8 activations
  FMatmulRows frun;    // float32 activations
  int64_t block, bytes;
};

template <class W>
Kind kind() {
  return {&matmul_rows<W>, &fmatmul_rows<W>, W::BLOCK, W::BYTES};
}

Kind kind_of(int64_t ggml_type) {
  switch (ggml_type) {
    case 2: return kind<Q4_0>();
    case 3: return kind<Q4_1>();
    case 8: return kind<Q8_0>();
    case 12: return kind<Q4_K>();
    case 13: return kind<Q5_K>();
    case 14: return kind<Q6_K>();
    default: TORCH_CHECK(false, "no quantized kernel for GGML type ", ggml_type);
  }
}

int64_t quant_level() { return BEST_LEVEL; }

// x [M, K] float32 times the weights (uint8 [N_i, row_bytes_i] each, of GGML type types[i], K values a row),
// side by side: returns [M, sum N_i]. level: 0 scalar, 1 AVX2, 2 AVX-512 VNNI, -1 the best this CPU runs.
// float_x: the float path (weights de-quantized in registers, x as it is); else x is quantized to int8.
at::Tensor quant_linear(const at::Tensor& x_in, at::TensorList weights, at::IntArrayRef types, int64_t level,
                        bool float_x) {
  TORCH_CHECK(x_in.dim() == 2 && x_in.scalar_type() == at::kFloat, "x must be float32 [M, K]");
  TORCH_CHECK(weights.size() == types.size() && !weights.empty(), "one GGML type per weight");
  TORCH_CHECK(level <= BEST_LEVEL, "level ", level, " is not built for this CPU (best: ", BEST_LEVEL, ")");
  level = level < 0 ? BEST_LEVEL : level;
  const auto x = x_in.contiguous();
  const int64_t m_rows = x.size(0), k = x.size(1), x_blocks = k / QK;
  TORCH_CHECK(k % QK == 0, "K = ", k, " is not a multiple of ", QK);
  std::vector<Kind> kinds;
  std::vector<int64_t> cols{0};
  for (size_t i = 0; i < weights.size(); ++i) {
    const Kind kd = kind_of(types[i]);
    const auto& w = weights[i];
    TORCH_CHECK(w.scalar_type() == at::kByte && w.dim() == 2 && w.stride(1) == 1 && w.stride(0) == w.size(1),
                "weight ", i, " must be contiguous uint8 [N, row_bytes]");
    TORCH_CHECK(k % kd.block == 0 && w.size(1) == k / kd.block * kd.bytes, "weight ", i, " has ", w.size(1),
                " bytes a row, not K = ", k, " values of its type");
    kinds.push_back(kd);
    cols.push_back(cols.back() + w.size(0));
  }
  const float* xp = x.data_ptr<float>();
  std::vector<BlockQ8> xq(float_x ? 0 : m_rows * x_blocks);
  if (!float_x) {
    at::parallel_for(0, m_rows, 1, [&](int64_t begin, int64_t end) {
      for (int64_t m = begin; m < end; ++m) quantize_row(xp + m * k, k, xq.data() + m * x_blocks);
    });
  }
  const int64_t total = cols.back();
  auto out = at::empty({m_rows, total}, x.options());
  float* o = out.data_ptr<float>();
  at::parallel_for(0, total, 8, [&](int64_t begin, int64_t end) {
    for (size_t i = 0; i < kinds.size(); ++i) {
      const int64_t lo = std::max(begin, cols[i]), hi = std::min(end, cols[i + 1]);
      if (lo >= hi) continue;
      const uint8_t* w = weights[i].data_ptr<uint8_t>();
      const int lv = static_cast<int>(level);
      if (float_x)
        kinds[i].frun(lv, w, weights[i].size(1), xp, m_rows, k, o, total, cols[i], lo - cols[i], hi - cols[i]);
      else
        kinds[i].run(lv, w, weights[i].size(1), xq.data(), m_rows, x_blocks, o, total, cols[i], lo - cols[i],
                     hi - cols[i]);
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(pagedq_cpu, m) {
  m.def("quant_linear", &quant_linear);
  m.def("quant_level", &quant_level);
}

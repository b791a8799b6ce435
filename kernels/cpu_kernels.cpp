// The CPU kernels (kernels/cpu.py builds this file once per machine and loads it as torch.ops.pagedq_cpu):
// paged attention that reads the KV blocks in place, and fused elementwise work. Every kernel
// accumulates in float32 and writes in its input's dtype (float32, bfloat16 or float16).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#ifdef __AVX2__
#include <immintrin.h>
#endif

namespace {

// Built with -ffp-contract=off, so the elementwise kernels round like torch's; attention asks for FMAs.

template <typename T>
inline float dot(const float* q, const T* k, int64_t dim) {
  float acc = 0.f;
#pragma omp simd reduction(+ : acc)
  for (int64_t d = 0; d < dim; ++d) acc = std::fma(q[d], static_cast<float>(k[d]), acc);
  return acc;
}

template <typename T>
inline void axpy(float w, const T* v, float* out, int64_t dim) {
#pragma omp simd
  for (int64_t d = 0; d < dim; ++d) out[d] = std::fma(w, static_cast<float>(v[d]), out[d]);
}

// A key's score is the same bits whichever path computes it, so a query row's result does not depend on
// which keys share a call with it (a decode, or any prefill chunk): 8 lanes, lane l summing the products
// of d = l, l + 8, ... in order with FMAs, then this tree over the lanes (score_quad's horizontal adds).
inline float lane_sum(const float* a) { return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7])); }

// Scores of G query heads against two keys at once: 2 * G independent 8-lane accumulators keep the
// FMA units busy where one dot product at a time waits on its own chain. dim % 8 == 0.
template <int G, typename T>
inline void score_pair(const float* q, const T* k0, const T* k1, float* s0, float* s1, int64_t dim) {
  float a0[G][8] = {}, a1[G][8] = {};
  for (int64_t d = 0; d < dim; d += 8) {
    float x0[8], x1[8];
    for (int l = 0; l < 8; ++l) {
      x0[l] = static_cast<float>(k0[d + l]);
      x1[l] = static_cast<float>(k1[d + l]);
    }
    for (int g = 0; g < G; ++g)
      for (int l = 0; l < 8; ++l) {
        a0[g][l] = std::fma(q[g * dim + d + l], x0[l], a0[g][l]);
        a1[g][l] = std::fma(q[g * dim + d + l], x1[l], a1[g][l]);
      }
  }
  for (int g = 0; g < G; ++g) {
    s0[g] = lane_sum(a0[g]);
    s1[g] = lane_sum(a1[g]);
  }
}

#ifdef __AVX2__
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const at::Half* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline __m256 load8(const at::BFloat16* p) {
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}

// acc[g] += sum over the block's n value rows v_j of weights[g * row_len + j] * v_j, for G heads.
// A slice of the head dimension stays in registers across the rows (G x C accumulators), so each
// row is loaded once per slice and every FMA is independent; per element the sum runs over j in
// order, as the scalar loop's. dim % (8 * C) == 0.
template <int G, typename T>
void add_values(const float* weights, int64_t row_len, const T* values, int64_t stride, int64_t n, float* acc,
                int64_t dim) {
  constexpr int C = G <= 3 ? 4 : 2;
  for (int64_t d = 0; d < dim; d += 8 * C) {
    __m256 a[G][C];
    for (int g = 0; g < G; ++g)
      for (int c = 0; c < C; ++c) a[g][c] = _mm256_loadu_ps(acc + g * dim + d + 8 * c);
    for (int64_t j = 0; j < n; ++j) {
      const T* v = values + j * stride + d;
      __m256 w[G];
      for (int g = 0; g < G; ++g) w[g] = _mm256_broadcast_ss(weights + g * row_len + j);
      for (int c = 0; c < C; ++c) {
        const __m256 x = load8(v + 8 * c);
        for (int g = 0; g < G; ++g) a[g][c] = _mm256_fmadd_ps(w[g], x, a[g][c]);
      }
    }
    for (int g = 0; g < G; ++g)
      for (int c = 0; c < C; ++c) _mm256_storeu_ps(acc + g * dim + d + 8 * c, a[g][c]);
  }
}

// Scores of G <= 3 query heads against keys j..j + n - 1 (n <= 4) of a block: G x 4 accumulators stay in
// registers, the key rows are loaded once per 8 lanes, and three horizontal adds turn each head's 4 sums
// into 4 scores. Short of 4 keys, the last is loaded again in the missing ones' place.
template <int G, typename T>
void score_quad(const float* q, const T* keys, int64_t stride, int64_t n, float* scores, int64_t row_len,
                int64_t dim) {
  const T* k[4];
  for (int64_t i = 0; i < 4; ++i) k[i] = keys + std::min(i, n - 1) * stride;
  __m256 a[G][4];
  for (int g = 0; g < G; ++g)
    for (int i = 0; i < 4; ++i) a[g][i] = _mm256_setzero_ps();
  for (int64_t d = 0; d < dim; d += 8) {
    __m256 x[4];
    for (int i = 0; i < 4; ++i) x[i] = load8(k[i] + d);
    for (int g = 0; g < G; ++g) {
      const __m256 qg = _mm256_loadu_ps(q + g * dim + d);
      for (int i = 0; i < 4; ++i) a[g][i] = _mm256_fmadd_ps(qg, x[i], a[g][i]);
    }
  }
  for (int g = 0; g < G; ++g) {
    const __m256 pairs = _mm256_hadd_ps(_mm256_hadd_ps(a[g][0], a[g][1]), _mm256_hadd_ps(a[g][2], a[g][3]));
    const __m128 sums = _mm_add_ps(_mm256_castps256_ps128(pairs), _mm256_extractf128_ps(pairs, 1));
    if (n == 4) {
      _mm_storeu_ps(scores + g * row_len, sums);
    } else {
      alignas(16) float four[4];
      _mm_store_ps(four, sums);
      for (int64_t i = 0; i < n; ++i) scores[g * row_len + i] = four[i];
    }
  }
}
#endif

// Scores of G query heads against the n keys of one cache block (rows `stride` elements apart); every key
// through the same path (see lane_sum), a lone last key paired with itself.
template <int G, typename T>
void score_block(const float* q, const T* keys, int64_t stride, int64_t n, float* scores, int64_t row_len,
                 int64_t dim) {
#ifdef __AVX2__
  if constexpr (G <= 3 && !std::is_same_v<T, double>) {
    for (int64_t j = 0; j < n; j += 4)
      score_quad<G>(q, keys + j * stride, stride, std::min<int64_t>(4, n - j), scores + j, row_len, dim);
    return;
  }
#endif
  float s0[G], s1[G];
  for (int64_t j = 0; j < n; j += 2) {
    const T* k1 = keys + std::min(j + 1, n - 1) * stride;
    score_pair<G>(q, keys + j * stride, k1, s0, s1, dim);
    for (int g = 0; g < G; ++g) {
      scores[g * row_len + j] = s0[g];
      if (j + 1 < n) scores[g * row_len + j + 1] = s1[g];
    }
  }
}

// Calls f(std::integral_constant<int, G>) for a GQA group of 1..4 heads and says whether it did: the
// kernels unrolled per group size, with a generic loop for the rest.
template <typename F>
bool with_group(int64_t group, F&& f) {
  switch (group) {
    case 1: f(std::integral_constant<int, 1>{}); return true;
    case 2: f(std::integral_constant<int, 2>{}); return true;
    case 3: f(std::integral_constant<int, 3>{}); return true;
    case 4: f(std::integral_constant<int, 4>{}); return true;
    default: return false;
  }
}

template <typename T>
void score_any(const float* q, const T* keys, int64_t stride, int64_t n, float* scores, int64_t row_len,
               int64_t group, int64_t dim) {
  auto unrolled = [&](auto G) { score_block<G()>(q, keys, stride, n, scores, row_len, dim); };
  if (dim % 8 == 0 && with_group(group, unrolled)) return;
  for (int64_t j = 0; j < n; ++j)
    for (int64_t g = 0; g < group; ++g) scores[g * row_len + j] = dot(q + g * dim, keys + j * stride, dim);
}

template <typename T>
void add_values_any(const float* weights, int64_t row_len, const T* values, int64_t stride, int64_t n,
                    float* acc, int64_t group, int64_t dim) {
#ifdef __AVX2__
  if constexpr (!std::is_same_v<T, double>) {
    auto unrolled = [&](auto G) { add_values<G()>(weights, row_len, values, stride, n, acc, dim); };
    if (dim % 32 == 0 && with_group(group, unrolled)) return;
  }
#endif
  for (int64_t j = 0; j < n; ++j)
    for (int64_t g = 0; g < group; ++g) axpy(weights[g * row_len + j], values + j * stride, acc + g * dim, dim);
}

// Query rows attend in tiles: up to TILE_ROWS rows of one sequence at consecutive positions, against each
// K/V block in turn, so a block is read from memory once for the tile's rows, not once per row.
constexpr int64_t TILE_ROWS = 16;

struct Tile {  // query rows token..token + rows - 1 of sequence seq, at positions position.. onwards
  int64_t token, seq, position, rows;
};

std::vector<Tile> plan_tiles(const at::Tensor& query_start_loc, const at::Tensor& seq_lens, int64_t num_tokens,
                             int64_t max_query_len) {
  auto starts = query_start_loc.to(at::kLong).contiguous();
  auto lens = seq_lens.to(at::kLong).contiguous();
  const int64_t* s = starts.data_ptr<int64_t>();
  const int64_t* l = lens.data_ptr<int64_t>();
  std::vector<Tile> tiles;
  for (int64_t b = 0; b < lens.size(0); ++b) {
    TORCH_CHECK(s[b + 1] - s[b] <= l[b] && s[b + 1] <= num_tokens, "sequence ", b, " does not fit the query");
    if (s[b + 1] - s[b] > max_query_len) continue;
    for (int64_t t = s[b]; t < s[b + 1]; t += TILE_ROWS)
      tiles.push_back({t, b, l[b] - (s[b + 1] - t), std::min(TILE_ROWS, s[b + 1] - t)});
  }
  return tiles;
}

#ifdef __AVX2__
// exp(x) for x <= 0 to about 2 ulp (Cephes' expf polynomial): e^x = 2^n * e^r, |r| <= ln(2) / 2.
inline __m256 exp8(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.3f));  // below it e^x is 0 in float32 anyway
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  for (const float c : {1.3981999507e-3f, 8.3334519073e-3f, 4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f})
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.f)));
  const __m256i scale = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(scale));
}

inline float hsum8(__m256 v) {
  const __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 q = _mm_add_ps(h, _mm_movehl_ps(h, h));
  return _mm_cvtss_f32(_mm_add_ss(q, _mm_movehdup_ps(q)));
}
#endif

// s = softmax(s), in place.
inline void softmax(float* s, int64_t n) {
  float top = -INFINITY, total = 0.f;
  int64_t j = 0;
#ifdef __AVX2__
  __m256 top8 = _mm256_set1_ps(-INFINITY);
  for (; j + 8 <= n; j += 8) top8 = _mm256_max_ps(top8, _mm256_loadu_ps(s + j));
  const __m128 h = _mm_max_ps(_mm256_castps256_ps128(top8), _mm256_extractf128_ps(top8, 1));
  const __m128 q = _mm_max_ps(h, _mm_movehl_ps(h, h));
  top = _mm_cvtss_f32(_mm_max_ss(q, _mm_movehdup_ps(q)));
#endif
  for (; j < n; ++j) top = std::max(top, s[j]);
  j = 0;
#ifdef __AVX2__
  __m256 total8 = _mm256_setzero_ps();
  for (; j + 8 <= n; j += 8) {
    const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + j), _mm256_set1_ps(top)));
    _mm256_storeu_ps(s + j, e);
    total8 = _mm256_add_ps(total8, e);
  }
  total = hsum8(total8);
#endif
  for (; j < n; ++j) total += (s[j] = std::exp(s[j] - top));
  const float inv = 1.f / total;
  for (j = 0; j < n; ++j) s[j] *= inv;
}

// A cache block's rows for one kv head, fetched towards L1 ahead of use: block tables scatter a sequence's
// blocks over the pool, where the hardware prefetchers lose the trail at every block.
template <typename T>
inline void prefetch_rows(const T* rows, int64_t stride, int64_t n, int64_t dim) {
  for (int64_t j = 0; j < n; ++j)
    for (int64_t at = 0; at < dim * static_cast<int64_t>(sizeof(T)); at += 64)
      __builtin_prefetch(reinterpret_cast<const char*>(rows + j * stride) + at);
}

// One tile and one kv head: each row's `group` query heads attend keys 0..its position, the tile's rows
// block by block. A row's sums run in the same order as when it attends alone (a decode): key by key
// for its scores and its softmax, and over the keys in order for each output element.
template <typename T>
void attend(const T* query, int64_t query_stride, const T* k_cache, const T* v_cache, const int64_t* table,
            T* out, const Tile& tile, int64_t group, int64_t dim, int64_t block_size, int64_t kv_heads,
            int64_t kv_head, float scale, std::vector<float>& scratch) {
  const int64_t width = tile.position + tile.rows, vectors = tile.rows * group;  // the last row's keys
  scratch.resize(vectors * (width + 2 * dim));
  float* q = scratch.data();
  float* acc = q + vectors * dim;
  float* scores = acc + vectors * dim;
  for (int64_t r = 0; r < tile.rows; ++r)
    for (int64_t i = 0; i < group * dim; ++i) {
      q[r * group * dim + i] = static_cast<float>(query[r * query_stride + i]) * scale;
      acc[r * group * dim + i] = 0.f;
    }
  // Key j sits in block table[j / block_size], row j % block_size; walking block by block keeps
  // integer division out of the inner loops.
  const int64_t stride = kv_heads * dim;
  auto block = [&](const T* cache, int64_t b) { return cache + (table[b] * block_size * kv_heads + kv_head) * dim; };
  auto keys_in = [&](int64_t r, int64_t start) { return std::min(block_size, tile.position + r + 1 - start); };
  auto first_row = [&](int64_t start) { return std::max<int64_t>(0, start - tile.position); };  // with keys there
  auto prefetch_next = [&](const T* cache, int64_t start, int64_t b) {
    if (start + block_size < width) prefetch_rows(block(cache, b + 1), stride, block_size, dim);
  };
  for (int64_t start = 0, b = 0; start < width; start += block_size, ++b) {
    prefetch_next(k_cache, start, b);
    for (int64_t r = first_row(start); r < tile.rows; ++r)
      score_any(q + r * group * dim, block(k_cache, b), stride, keys_in(r, start),
                scores + r * group * width + start, width, group, dim);
  }
  for (int64_t r = 0; r < tile.rows; ++r)
    for (int64_t g = 0; g < group; ++g) softmax(scores + (r * group + g) * width, tile.position + r + 1);
  for (int64_t start = 0, b = 0; start < width; start += block_size, ++b) {
    prefetch_next(v_cache, start, b);
    for (int64_t r = first_row(start); r < tile.rows; ++r)
      add_values_any(scores + r * group * width + start, width, block(v_cache, b), stride, keys_in(r, start),
                     acc + r * group * dim, group, dim);
  }
  for (int64_t r = 0; r < tile.rows; ++r)
    for (int64_t i = 0; i < group * dim; ++i) out[r * query_stride + i] = static_cast<T>(acc[r * group * dim + i]);
}

// query [T, heads, D]; caches [blocks, block_size, kv_heads, D]; block_tables [B, max_blocks];
// query_start_loc [B + 1]; seq_lens [B]. Token t of sequence b sits at position
// seq_lens[b] - (query_start_loc[b + 1] - t) and attends causally. Returns [T, heads, D]; the rows
// of sequences with more than max_query_len new tokens are left for the caller to fill.
at::Tensor paged_attention(const at::Tensor& query_in, const at::Tensor& k_cache, const at::Tensor& v_cache,
                           const at::Tensor& block_tables_in, const at::Tensor& query_start_loc,
                           const at::Tensor& seq_lens, double scale, int64_t max_query_len) {
  TORCH_CHECK(query_in.dim() == 3 && k_cache.dim() == 4, "query [T, H, D] and caches [N, bs, KV, D]");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(), "caches must be contiguous");
  TORCH_CHECK(query_in.scalar_type() == k_cache.scalar_type(), "query and cache dtypes differ");
  const auto query = query_in.contiguous();
  const auto tables = block_tables_in.to(at::kLong).contiguous();
  const int64_t num_tokens = query.size(0), heads = query.size(1), dim = query.size(2);
  const int64_t block_size = k_cache.size(1), kv_heads = k_cache.size(2);
  TORCH_CHECK(heads % kv_heads == 0 && k_cache.size(3) == dim, "query heads do not fit the cache");
  const int64_t group = heads / kv_heads, width = tables.size(1);
  const std::vector<Tile> tiles = plan_tiles(query_start_loc, seq_lens, num_tokens, max_query_len);
  const int64_t items = static_cast<int64_t>(tiles.size()) * kv_heads;
  auto out = at::empty_like(query);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, query.scalar_type(), "paged_attention", [&] {
    const scalar_t* q = query.data_ptr<scalar_t>();
    const scalar_t* k = k_cache.data_ptr<scalar_t>();
    const scalar_t* v = v_cache.data_ptr<scalar_t>();
    scalar_t* o = out.data_ptr<scalar_t>();
    const int64_t* table = tables.data_ptr<int64_t>();
    // Dynamic scheduling: tiles differ in length, and a static split leaves one thread waiting.
    _Pragma("omp parallel num_threads(at::get_num_threads())")
    {
      std::vector<float> scratch;
      _Pragma("omp for schedule(dynamic, 1)")
      for (int64_t item = 0; item < items; ++item) {
        const Tile& tile = tiles[item / kv_heads];
        const int64_t h = item % kv_heads, offset = (tile.token * heads + h * group) * dim;
        attend(q + offset, heads * dim, k, v, table + tile.seq * width, o + offset, tile, group, dim, block_size,
               kv_heads, h, static_cast<float>(scale), scratch);
      }
    }
  });
  return out;
}

// An encoder's bidirectional attention over packed inputs: qkv [T, 3 * heads * D] as the fused projection
// writes it (q, k, v side by side in each row), input b its rows starts[b]..starts[b] + lens[b]. Every
// query row attends all the rows of its own input, read in place; returns [T, heads * D]. Queries of one
// head go three at a time (score_quad's widest group, whose per-query sums are those of a group of one or
// two), so a row's result does not depend on the other inputs, nor on where in its input it sits.
at::Tensor encoder_attention(const at::Tensor& qkv_in, at::IntArrayRef lens, int64_t heads, double scale) {
  TORCH_CHECK(qkv_in.dim() == 2 && heads > 0 && qkv_in.size(1) % (3 * heads) == 0, "qkv must be [T, 3 * heads * D]");
  const auto qkv = qkv_in.contiguous();
  const int64_t width = qkv.size(1), hidden = width / 3, dim = hidden / heads;
  struct Item { int64_t start, len, head, first; };
  std::vector<Item> items;
  int64_t start = 0;
  for (const int64_t len : lens) {
    TORCH_CHECK(len > 0, "inputs must have at least one token");
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t first = 0; first < len; first += 3) items.push_back({start, len, h, first});
    start += len;
  }
  TORCH_CHECK(start == qkv.size(0), "lens sum to ", start, " rows, qkv has ", qkv.size(0));
  auto out = at::empty({start, hidden}, qkv.options());
  const int64_t num_items = static_cast<int64_t>(items.size());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, qkv.scalar_type(), "encoder_attention", [&] {
    const scalar_t* base = qkv.data_ptr<scalar_t>();
    scalar_t* o = out.data_ptr<scalar_t>();
    _Pragma("omp parallel num_threads(at::get_num_threads())")
    {
      std::vector<float> scratch;
      _Pragma("omp for schedule(dynamic, 8)")
      for (int64_t i = 0; i < num_items; ++i) {
        const Item& it = items[i];
        const int64_t group = std::min<int64_t>(3, it.len - it.first);
        scratch.resize(group * (2 * dim + it.len));
        float* q = scratch.data();
        float* acc = q + group * dim;
        float* scores = acc + group * dim;
        const scalar_t* rows = base + it.start * width + it.head * dim;
        for (int64_t g = 0; g < group; ++g)
          for (int64_t d = 0; d < dim; ++d) {
            q[g * dim + d] = static_cast<float>(rows[(it.first + g) * width + d]) * static_cast<float>(scale);
            acc[g * dim + d] = 0.f;
          }
        score_any(q, rows + hidden, width, it.len, scores, it.len, group, dim);
        for (int64_t g = 0; g < group; ++g) softmax(scores + g * it.len, it.len);
        add_values_any(scores, it.len, rows + 2 * hidden, width, it.len, acc, group, dim);
        for (int64_t g = 0; g < group; ++g) {
          scalar_t* row = o + (it.start + it.first + g) * hidden + it.head * dim;
          for (int64_t d = 0; d < dim; ++d) row[d] = static_cast<scalar_t>(acc[g * dim + d]);
        }
      }
    }
  });
  return out;
}

// (weight * rmsnorm(x + residual), x + residual) over the last dimension of [rows, hidden] tensors.
std::tuple<at::Tensor, at::Tensor> add_rms_norm(const at::Tensor& x_in, const at::Tensor& residual_in,
                                                const at::Tensor& weight_in, double eps) {
  const auto x = x_in.contiguous(), residual = residual_in.contiguous(), weight = weight_in.contiguous();
  TORCH_CHECK(x.sizes() == residual.sizes() && x.scalar_type() == residual.scalar_type(), "x and residual differ");
  TORCH_CHECK(weight.scalar_type() == x.scalar_type(), "weight and x dtypes differ");
  const int64_t hidden = x.size(-1), rows = x.numel() / hidden;
  auto normed = at::empty_like(x), total = at::empty_like(x);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "add_rms_norm", [&] {
    const scalar_t *a = x.data_ptr<scalar_t>(), *b = residual.data_ptr<scalar_t>();
    const scalar_t* w = weight.data_ptr<scalar_t>();
    scalar_t *n = normed.data_ptr<scalar_t>(), *s = total.data_ptr<scalar_t>();
    at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const int64_t base = r * hidden;
        float squares = 0.f;
        for (int64_t i = 0; i < hidden; ++i) {
          s[base + i] = a[base + i] + b[base + i];  // rounded to the dtype first, as the reference does
          const float v = static_cast<float>(s[base + i]);
          squares += v * v;
        }
        const float inv = 1.f / std::sqrt(squares / hidden + static_cast<float>(eps));
        for (int64_t i = 0; i < hidden; ++i)
          n[base + i] = w[i] * static_cast<scalar_t>(static_cast<float>(s[base + i]) * inv);
      }
    });
  });
  return {normed, total};
}

// silu(gate) * up for x = [gate | up] along the last dimension.
at::Tensor silu_and_mul(const at::Tensor& x_in) {
  const auto x = x_in.contiguous();
  const int64_t width = x.size(-1) / 2, rows = x.numel() / (2 * width);
  auto sizes = x.sizes().vec();
  sizes.back() = width;
  auto out = at::empty(sizes, x.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "silu_and_mul", [&] {
    const scalar_t* in = x.data_ptr<scalar_t>();
    scalar_t* o = out.data_ptr<scalar_t>();
    at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const scalar_t *gate = in + r * 2 * width, *up = gate + width;
        for (int64_t i = 0; i < width; ++i) {
          const float g = static_cast<float>(gate[i]);
          const scalar_t silu = static_cast<scalar_t>(g / (1.f + std::exp(-g)));
          o[r * width + i] = silu * up[i];
        }
      }
    });
  });
  return out;
}

// x * cos + roll(x, D / 2) * signed_sin, in place, for x [T, heads, D] (rows may be strided) and
// cos / signed_sin [T, 1, D]. Returns x.
at::Tensor rotate(at::Tensor x, const at::Tensor& cos_in, const at::Tensor& sin_in) {
  TORCH_CHECK(x.dim() == 3 && x.stride(2) == 1, "x must be [T, heads, D] with contiguous rows");
  const auto cos = cos_in.contiguous(), sin = sin_in.contiguous();
  const int64_t tokens = x.size(0), heads = x.size(1), dim = x.size(2), half = dim / 2;
  const int64_t token_stride = x.stride(0), head_stride = x.stride(1);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "rotate", [&] {
    scalar_t* base = x.data_ptr<scalar_t>();
    const scalar_t *c = cos.data_ptr<scalar_t>(), *s = sin.data_ptr<scalar_t>();
    at::parallel_for(0, tokens, 8, [&](int64_t begin, int64_t end) {
      std::vector<scalar_t> copy(dim);
      for (int64_t t = begin; t < end; ++t) {
        const scalar_t *ct = c + t * dim, *st = s + t * dim;
        for (int64_t h = 0; h < heads; ++h) {
          scalar_t* row = base + t * token_stride + h * head_stride;
          std::copy(row, row + dim, copy.begin());
          for (int64_t i = 0; i < dim; ++i) {
            const scalar_t rolled = copy[(i + half) % dim];
            const scalar_t a = copy[i] * ct[i], b = rolled * st[i];
            row[i] = a + b;
          }
        }
      }
    });
  });
  return x;
}

// The K and V of T new tokens ([T, heads, D]; tokens may be strided, each its own way)
// stored at their cache slots (caches [blocks, block_size, heads, D], contiguous, of their dtype), in
// place: one copy of each token's row, where index_copy_ went through a general indexing kernel twice.
void write_kv(const at::Tensor& key_in, const at::Tensor& value_in, at::Tensor k_cache, at::Tensor v_cache,
              const at::Tensor& slot_mapping) {
  TORCH_CHECK(key_in.dim() == 3 && key_in.sizes() == value_in.sizes(), "key and value must be [T, heads, D]");
  const auto rows = [](const at::Tensor& x) {  // each token's heads one contiguous row, or a copy
    return x.stride(2) == 1 && (x.size(1) == 1 || x.stride(1) == x.size(2)) ? x : x.contiguous();
  };
  const auto key = rows(key_in), value = rows(value_in);
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous() && k_cache.sizes() == v_cache.sizes(),
              "the caches must be contiguous and alike");
  TORCH_CHECK(key.scalar_type() == k_cache.scalar_type() && value.scalar_type() == v_cache.scalar_type(),
              "key, value and caches must share a dtype");
  const auto slots = slot_mapping.to(at::kLong).contiguous();
  const int64_t tokens = key.size(0), row = key.size(1) * key.size(2);
  const int64_t ks = key.stride(0), vs = value.stride(0);
  TORCH_CHECK(slots.numel() == tokens && k_cache.numel() % row == 0, "slot_mapping or caches do not fit");
  const int64_t capacity = k_cache.numel() / row;
  const int64_t* s = slots.data_ptr<int64_t>();
  for (int64_t t = 0; t < tokens; ++t) TORCH_CHECK(s[t] >= 0 && s[t] < capacity, "slot out of the cache");
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, key.scalar_type(), "write_kv", [&] {
    const scalar_t *k = key.data_ptr<scalar_t>(), *v = value.data_ptr<scalar_t>();
    scalar_t *kc = k_cache.data_ptr<scalar_t>(), *vc = v_cache.data_ptr<scalar_t>();
    for (int64_t t = 0; t < tokens; ++t) {
      std::copy(k + t * ks, k + t * ks + row, kc + s[t] * row);
      std::copy(v + t * vs, v + t * vs + row, vc + s[t] * row);
    }
  });
}


// ---- The batch-invariant float32 linear: out[i][j] = dot(x_i, w_j) (+ bias[j]) ----
// Every output element is the same sum whatever the number of rows, the tile a row falls in, the
// thread that runs it or the instruction set: lane l of 16 accumulates k = l, l + 16, ... in order with
// FMAs (the K % 16 tail included), then the 16 lanes add in one fixed tree. FMA rounds once, so the
// AVX-512, AVX2 and scalar code give the same bits; only speed depends on the tile shape.

constexpr int LANES = 16;

inline float reduce16(const float* a) {  // ((a0 + a8) + ...) in a fixed order
  float h[8];
  for (int l = 0; l < 8; ++l) h[l] = a[l] + a[l + 8];
  return ((h[0] + h[4]) + (h[2] + h[6])) + ((h[1] + h[5]) + (h[3] + h[7]));
}

#if defined(__AVX2__)
// reduce16 on h = a[0..8) + a[8..16), in registers: (h0 + h4) ... in the same order, so the same bits.
inline float reduce16(__m256 h) {
  const __m128 g = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  const __m128 q = _mm_add_ps(g, _mm_movehl_ps(g, g));
  return _mm_cvtss_f32(_mm_add_ss(q, _mm_shuffle_ps(q, q, 1)));
}
#endif

// An R x C tile of outputs: rows x[0..R) (`xs` apart), weight rows w[0..C) (`ws` apart), K long.
template <int R, int C>
void linear_tile(const float* x, int64_t xs, const float* w, int64_t ws, int64_t K, float* out, int64_t os,
                 const float* bias) {
  alignas(64) float acc[R][C][LANES];
  const int64_t body = K - K % LANES;
#if defined(__AVX512F__)
  __m512 a[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) a[r][c] = _mm512_setzero_ps();
  for (int64_t k = 0; k < body; k += LANES) {
    __m512 wv[C];
    for (int c = 0; c < C; ++c) wv[c] = _mm512_loadu_ps(w + c * ws + k);
    for (int r = 0; r < R; ++r) {
      const __m512 xv = _mm512_loadu_ps(x + r * xs + k);
      for (int c = 0; c < C; ++c) a[r][c] = _mm512_fmadd_ps(xv, wv[c], a[r][c]);
    }
  }
  if (body == K) {  // no tail: each sum reduced in registers
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c) {
        const __m512 v = a[r][c];
        const float sum = reduce16(_mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1)));
        out[r * os + c] = bias ? sum + bias[c] : sum;
      }
    return;
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) _mm512_store_ps(acc[r][c], a[r][c]);
#elif defined(__AVX2__)
  __m256 lo[R][C], hi[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) lo[r][c] = hi[r][c] = _mm256_setzero_ps();
  for (int64_t k = 0; k < body; k += LANES) {
    __m256 wl[C], wh[C];
    for (int c = 0; c < C; ++c) {
      wl[c] = _mm256_loadu_ps(w + c * ws + k);
      wh[c] = _mm256_loadu_ps(w + c * ws + k + 8);
    }
    for (int r = 0; r < R; ++r) {
      const __m256 xl = _mm256_loadu_ps(x + r * xs + k), xh = _mm256_loadu_ps(x + r * xs + k + 8);
      for (int c = 0; c < C; ++c) {
        lo[r][c] = _mm256_fmadd_ps(xl, wl[c], lo[r][c]);
        hi[r][c] = _mm256_fmadd_ps(xh, wh[c], hi[r][c]);
      }
    }
  }
  if (body == K) {
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c) {
        const float sum = reduce16(_mm256_add_ps(lo[r][c], hi[r][c]));
        out[r * os + c] = bias ? sum + bias[c] : sum;
      }
    return;
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) {
      _mm256_store_ps(acc[r][c], lo[r][c]);
      _mm256_store_ps(acc[r][c] + 8, hi[r][c]);
    }
#else
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c)
      for (int l = 0; l < LANES; ++l) acc[r][c][l] = 0.f;
  for (int64_t k = 0; k < body; k += LANES)
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c)
        for (int l = 0; l < LANES; ++l)
          acc[r][c][l] = std::fma(x[r * xs + k + l], w[c * ws + k + l], acc[r][c][l]);
#endif
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) {
      for (int64_t k = body; k < K; ++k)
        acc[r][c][k - body] = std::fma(x[r * xs + k], w[c * ws + k], acc[r][c][k - body]);
      const float sum = reduce16(acc[r][c]);
      out[r * os + c] = bias ? sum + bias[c] : sum;
    }
}

// Tile shapes measured with bench/invariant_linear_cpu.py: on AVX-512 5 x 5 (25 accumulators, 5 weight and
// one activation register of 32: ten loads feed 25 FMAs) against 4 x 4 gave 1.2-1.6x at 32-512 rows.
#if defined(__AVX512F__)
constexpr int TILE_R = 5, TILE_C = 5;
#else
constexpr int TILE_R = 2, TILE_C = 3;
#endif
using TileFn = void (*)(const float*, int64_t, const float*, int64_t, int64_t, float*, int64_t, const float*);

template <int R, int... Cs>
constexpr std::array<TileFn, sizeof...(Cs)> tile_row(std::integer_sequence<int, Cs...>) {
  return {&linear_tile<R, Cs + 1>...};
}

template <int... Rs>
constexpr std::array<std::array<TileFn, TILE_C>, sizeof...(Rs)> tile_table(std::integer_sequence<int, Rs...>) {
  return {tile_row<Rs + 1>(std::make_integer_sequence<int, TILE_C>{})...};
}

// x [M, K], weight [N, K] (nn.Linear's), bias [N] or None, all float32: [M, N]. Work items are blocks of
// 64 rows x 64 weight rows, so a block's weights stay in cache across its row tiles.
at::Tensor invariant_linear(const at::Tensor& x_in, const at::Tensor& w_in, const c10::optional<at::Tensor>& bias_in) {
  TORCH_CHECK(x_in.scalar_type() == at::kFloat && w_in.scalar_type() == at::kFloat, "float32 x and weight");
  TORCH_CHECK(w_in.dim() == 2 && x_in.size(-1) == w_in.size(1), "x [.., K] and weight [N, K]");
  const auto w = w_in.contiguous();
  const int64_t K = w.size(1), N = w.size(0);
  const auto x = x_in.reshape({-1, K}).contiguous();
  const int64_t M = x.size(0);
  at::Tensor bias;
  if (bias_in.has_value()) bias = bias_in->to(at::kFloat).contiguous();
  auto sizes = x_in.sizes().vec();
  sizes.back() = N;
  auto out = at::empty({M, N}, x.options());
  static constexpr auto tiles = tile_table(std::make_integer_sequence<int, TILE_R>{});
  constexpr int64_t BLOCK = 64;
  const int64_t row_blocks = (M + BLOCK - 1) / BLOCK, col_blocks = (N + BLOCK - 1) / BLOCK;
  const float *xp = x.data_ptr<float>(), *wp = w.data_ptr<float>();
  const float* bp = bias.defined() ? bias.data_ptr<float>() : nullptr;
  float* op = out.data_ptr<float>();
  at::parallel_for(0, row_blocks * col_blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t r0 = item / col_blocks * BLOCK, c0 = item % col_blocks * BLOCK;
      const int64_t r1 = std::min(M, r0 + BLOCK), c1 = std::min(N, c0 + BLOCK);
      for (int64_t i = r0; i < r1; i += TILE_R) {
        const int64_t rows = std::min<int64_t>(TILE_R, r1 - i);
        for (int64_t j = c0; j < c1; j += TILE_C) {
          const int64_t cols = std::min<int64_t>(TILE_C, c1 - j);
          tiles[rows - 1][cols - 1](xp + i * K, K, wp + j * K, K, K, op + i * N + j, N, bp ? bp + j : nullptr);
        }
      }
    }
  });
  return out.view(sizes);
}

// ---- The same sums from packed weights, where AVX2 is the widest (no AVX-512) ----
// With 8-wide registers the tiles above hold two accumulators per output and load more than they
// multiply. Here the 16 lanes are 16 small products instead: lane l multiplies x[:, l::16] by
// w[:, l::16], k ascending, one FMA at a time into each output's lane-l sum (as above), for a tile of
// PACK_ROWS rows x PANEL columns, 8 outputs to a register; the lanes' sums then add in reduce16's tree,
// 8 outputs at a time. Same operations per output, so the same bits as every other path. Weights are
// packed once (pack_invariant_linear): per panel of PANEL columns, lane by lane, k by k; a step's rows
// are packed per tile the same way, so each lane's operands are read in order from the L1 cache.

// 6 x 2 measured best of 4 x 3, 6 x 2, 5 x 2, 3 x 4 and 2 x 6 (Zen 3): 12 sums, 2 weight loads and 6
// broadcasts feed 12 FMAs; 3 x 4 and 2 x 6 run out of the 16 registers.
constexpr int PACK_ROWS = 6, PACK_VECTORS = 2, PANEL = 8 * PACK_VECTORS;
constexpr int64_t PACK_TILES = 16;  // row tiles per work item: a lane's weights stay in L1 across them

bool packs_invariant_linear() {
#if defined(__AVX2__) && !defined(__AVX512F__)
  return true;
#else
  return false;
#endif
}

// w [N, K] (K % 16 == 0) -> [panels, 16, K / 16, PANEL]: panel p, lane l, step s, column c holds
// w[p * PANEL + c][s * 16 + l], zero past N.
at::Tensor pack_invariant_linear(const at::Tensor& w_in) {
  TORCH_CHECK(w_in.scalar_type() == at::kFloat && w_in.dim() == 2 && w_in.size(1) % LANES == 0,
              "a float32 weight [N, K] with K a multiple of 16");
  const auto w = w_in.contiguous();
  const int64_t N = w.size(0), K = w.size(1), steps = K / LANES, panels = (N + PANEL - 1) / PANEL;
  auto packed = at::zeros({panels, LANES, steps, PANEL}, w.options());
  const float* src = w.data_ptr<float>();
  float* dst = packed.data_ptr<float>();
  at::parallel_for(0, panels, 1, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p)
      for (int64_t c = 0; c < std::min<int64_t>(PANEL, N - p * PANEL); ++c)
        for (int64_t s = 0; s < steps; ++s)
          for (int64_t l = 0; l < LANES; ++l)
            dst[((p * LANES + l) * steps + s) * PANEL + c] = src[(p * PANEL + c) * K + s * LANES + l];
  });
  return packed;
}

#if defined(__AVX2__)
// The sums of L consecutive lanes for R rows (of a tile packed PACK_ROWS wide) x PANEL columns into
// part [R][PANEL], lane i's operands and part `x_lane`, `w_lane` and `part_lane` floats after lane 0's.
// Fewer rows take more lanes at once (lanes_for), so that a step has 8-12 independent sums to feed the
// FMA units.
template <int R, int L>
__attribute__((noinline)) void lane_tile(const float* x, int64_t x_lane, const float* w, int64_t w_lane,
                                         int64_t steps, float* part, int64_t part_lane) {
  __m256 acc[L][R][PACK_VECTORS];
  for (int i = 0; i < L; ++i)
    for (int r = 0; r < R; ++r)
      for (int v = 0; v < PACK_VECTORS; ++v) acc[i][r][v] = _mm256_setzero_ps();
  int64_t s = 0;
  do {  // steps >= 1: with a path that skips the loop, GCC kept the sums in memory at every step
    for (int i = 0; i < L; ++i) {
      __m256 wv[PACK_VECTORS];
      for (int v = 0; v < PACK_VECTORS; ++v) {
        wv[v] = _mm256_loadu_ps(w + i * w_lane + s * PANEL + 8 * v);
        __asm__("" : "+x"(wv[v]));  // in a register: else GCC loads it again for every row's FMA
      }
      for (int r = 0; r < R; ++r) {
        const __m256 xv = _mm256_broadcast_ss(x + i * x_lane + s * PACK_ROWS + r);
        for (int v = 0; v < PACK_VECTORS; ++v) acc[i][r][v] = _mm256_fmadd_ps(xv, wv[v], acc[i][r][v]);
      }
    }
  } while (++s < steps);
  for (int i = 0; i < L; ++i)
    for (int r = 0; r < R; ++r)
      for (int v = 0; v < PACK_VECTORS; ++v) _mm256_storeu_ps(part + i * part_lane + r * PANEL + 8 * v, acc[i][r][v]);
}

constexpr int lanes_for(int rows) { return rows == 1 ? 4 : rows <= 3 ? 2 : 1; }  // 8-12 sums

// out[r][c] = the lanes' sums part [16][PACK_ROWS][PANEL] in reduce16's tree (+ bias), `cols` columns.
void add_lanes(const float* part, int64_t rows, int64_t cols, const float* bias, float* out, int64_t os) {
  alignas(32) float sums[PANEL];
  for (int64_t r = 0; r < rows; ++r) {
    for (int v = 0; v < PACK_VECTORS; ++v) {
      auto lane = [&](int l) { return _mm256_loadu_ps(part + (l * PACK_ROWS + r) * PANEL + 8 * v); };
      __m256 h[8];
      for (int l = 0; l < 8; ++l) h[l] = _mm256_add_ps(lane(l), lane(l + 8));
      const __m256 sum = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(h[0], h[4]), _mm256_add_ps(h[2], h[6])),
                                       _mm256_add_ps(_mm256_add_ps(h[1], h[5]), _mm256_add_ps(h[3], h[7])));
      _mm256_store_ps(sums + 8 * v, sum);
    }
    for (int64_t c = 0; c < cols; ++c) out[r * os + c] = bias ? sums[c] + bias[c] : sums[c];
  }
}
#endif

// invariant_linear's result from pack_invariant_linear's weight (of N rows): x [M, K] -> [M, N].
at::Tensor invariant_linear_packed(const at::Tensor& x_in, const at::Tensor& packed, int64_t N,
                                   const c10::optional<at::Tensor>& bias_in) {
#if defined(__AVX2__)
  TORCH_CHECK(x_in.scalar_type() == at::kFloat && packed.dim() == 4 && packed.size(3) == PANEL,
              "float32 x and a weight from pack_invariant_linear");
  const int64_t steps = packed.size(2), K = steps * LANES, panels = packed.size(0);
  TORCH_CHECK(x_in.size(-1) == K && N <= panels * PANEL, "x [.., K] and the packed weight's K, N");
  const auto x = x_in.reshape({-1, K}).contiguous();
  const int64_t M = x.size(0), tiles = (M + PACK_ROWS - 1) / PACK_ROWS;
  at::Tensor bias;
  if (bias_in.has_value()) bias = bias_in->to(at::kFloat).contiguous();
  // x per tile as the weights: [tiles, 16, steps, PACK_ROWS], zero rows past M
  auto xs = at::empty({tiles, LANES, steps, PACK_ROWS}, x.options());
  const float* xp = x.data_ptr<float>();
  float* xsp = xs.data_ptr<float>();
  at::parallel_for(0, tiles, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t)
      for (int64_t r = 0, row = t * PACK_ROWS; r < PACK_ROWS; ++r, ++row)
        for (int64_t s = 0; s < steps; ++s)
          for (int64_t l = 0; l < LANES; ++l)
            xsp[((t * LANES + l) * steps + s) * PACK_ROWS + r] = row < M ? xp[row * K + s * LANES + l] : 0.f;
  });
  auto sizes = x_in.sizes().vec();
  sizes.back() = N;
  auto out = at::empty({M, N}, x.options());
  using LaneTile = void (*)(const float*, int64_t, const float*, int64_t, int64_t, float*, int64_t);
  static constexpr std::array<LaneTile, PACK_ROWS> tiles_of = {
      &lane_tile<1, lanes_for(1)>, &lane_tile<2, lanes_for(2)>, &lane_tile<3, lanes_for(3)>,
      &lane_tile<4, lanes_for(4)>, &lane_tile<5, lanes_for(5)>, &lane_tile<6, lanes_for(6)>};
  const float* wp = packed.data_ptr<float>();
  const float* bp = bias.defined() ? bias.data_ptr<float>() : nullptr;
  float* op = out.data_ptr<float>();
  const int64_t blocks = (tiles + PACK_TILES - 1) / PACK_TILES;
  const int64_t x_lane = steps * PACK_ROWS, w_lane = steps * PANEL, part_lane = PACK_ROWS * PANEL;
  at::parallel_for(0, blocks * panels, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> part(std::min(PACK_TILES, tiles) * LANES * part_lane);  // [tile][lane][row][column]
    for (int64_t item = begin; item < end; ++item) {
      const int64_t t0 = item / panels * PACK_TILES, t1 = std::min(tiles, t0 + PACK_TILES), p = item % panels;
      for (int64_t l0 = 0; l0 < LANES; l0 += lanes_for(1))  // these lanes' weights stay in L1 across the tiles
        for (int64_t t = t0; t < t1; ++t) {
          const int rows = static_cast<int>(std::min<int64_t>(PACK_ROWS, M - t * PACK_ROWS));
          for (int64_t l = l0; l < l0 + lanes_for(1); l += lanes_for(rows))
            tiles_of[rows - 1](xsp + (t * LANES + l) * x_lane, x_lane, wp + (p * LANES + l) * w_lane, w_lane, steps,
                               part.data() + ((t - t0) * LANES + l) * part_lane, part_lane);
        }
      const int64_t cols = std::min<int64_t>(PANEL, N - p * PANEL);
      for (int64_t t = t0; t < t1; ++t)
        add_lanes(part.data() + (t - t0) * LANES * PACK_ROWS * PANEL, std::min<int64_t>(PACK_ROWS, M - t * PACK_ROWS),
                  cols, bp ? bp + p * PANEL : nullptr, op + t * PACK_ROWS * N + p * PANEL, N);
    }
  });
  return out.view(sizes);
#else
  TORCH_CHECK(false, "invariant_linear_packed needs AVX2");
#endif
}

}  // namespace

TORCH_LIBRARY(pagedq_cpu, m) {
  m.def("paged_attention", &paged_attention);
  m.def("encoder_attention", &encoder_attention);
  m.def("add_rms_norm", &add_rms_norm);
  m.def("silu_and_mul", &silu_and_mul);
  m.def("rotate", &rotate);
  m.def("write_kv", &write_kv);
  m.def("invariant_linear", &invariant_linear);
  m.def("packs_invariant_linear", &packs_invariant_linear);
  m.def("pack_invariant_linear", &pack_invariant_linear);
  m.def("invariant_linear_packed", &invariant_linear_packed);
}

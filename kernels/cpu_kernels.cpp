// The CPU kernels (kernels/cpu.py builds this file once per machine and loads it as torch.ops.pagedq_cpu):
// paged attention that reads the KV blocks in place, and fused elementwise work. Every kernel
// accumulates in float32 and writes in its input's dtype (float32, bfloat16 or float16).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <tuple>
#include <vector>

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
    float t0 = 0.f, t1 = 0.f;
    for (int l = 0; l < 8; ++l) {
      t0 += a0[g][l];
      t1 += a1[g][l];
    }
    s0[g] = t0;
    s1[g] = t1;
  }
}

template <int G, typename T, typename Row>
void score_all(const float* q, const T* k_cache, Row row, float* scores, int64_t num_keys, int64_t dim) {
  float s0[G], s1[G];
  int64_t j = 0;
  for (; j + 1 < num_keys; j += 2) {
    score_pair<G>(q, row(k_cache, j), row(k_cache, j + 1), s0, s1, dim);
    for (int g = 0; g < G; ++g) {
      scores[g * num_keys + j] = s0[g];
      scores[g * num_keys + j + 1] = s1[g];
    }
  }
  for (; j < num_keys; ++j)
    for (int g = 0; g < G; ++g) scores[g * num_keys + j] = dot(q + g * dim, row(k_cache, j), dim);
}

struct Plan {  // the query rows to attend: row token[i] of sequence seq[i], at position[i] in it
  std::vector<int64_t> token, seq, position;
};

Plan plan_tokens(const at::Tensor& query_start_loc, const at::Tensor& seq_lens, int64_t num_tokens,
                 int64_t max_query_len) {
  auto starts = query_start_loc.to(at::kLong).contiguous();
  auto lens = seq_lens.to(at::kLong).contiguous();
  const int64_t* s = starts.data_ptr<int64_t>();
  const int64_t* l = lens.data_ptr<int64_t>();
  Plan plan;
  for (int64_t b = 0; b < lens.size(0); ++b) {
    TORCH_CHECK(s[b + 1] - s[b] <= l[b] && s[b + 1] <= num_tokens, "sequence ", b, " does not fit the query");
    if (s[b + 1] - s[b] > max_query_len) continue;
    for (int64_t t = s[b]; t < s[b + 1]; ++t) {
      plan.token.push_back(t);
      plan.seq.push_back(b);
      plan.position.push_back(l[b] - (s[b + 1] - t));
    }
  }
  return plan;
}

// One query token and one kv head: its `group` query heads attend keys 0..position of its sequence,
// reading each key and value row once, straight from its cache block.
template <typename T>
void attend(const T* query, const T* k_cache, const T* v_cache, const int64_t* table, T* out,
            int64_t position, int64_t group, int64_t dim, int64_t block_size, int64_t kv_heads,
            int64_t kv_head, float scale, std::vector<float>& scratch) {
  const int64_t num_keys = position + 1;
  scratch.resize(group * (num_keys + 2 * dim));
  float* q = scratch.data();
  float* acc = q + group * dim;
  float* scores = acc + group * dim;
  for (int64_t i = 0; i < group * dim; ++i) {
    q[i] = static_cast<float>(query[i]) * scale;
    acc[i] = 0.f;
  }
  auto row = [&](const T* cache, int64_t j) {
    return cache + ((table[j / block_size] * block_size + j % block_size) * kv_heads + kv_head) * dim;
  };
  if (dim % 8 == 0 && group >= 1 && group <= 4) {
    switch (group) {
      case 1: score_all<1>(q, k_cache, row, scores, num_keys, dim); break;
      case 2: score_all<2>(q, k_cache, row, scores, num_keys, dim); break;
      case 3: score_all<3>(q, k_cache, row, scores, num_keys, dim); break;
      default: score_all<4>(q, k_cache, row, scores, num_keys, dim); break;
    }
  } else {
    for (int64_t j = 0; j < num_keys; ++j) {
      const T* k = row(k_cache, j);
      for (int64_t g = 0; g < group; ++g) scores[g * num_keys + j] = dot(q + g * dim, k, dim);
    }
  }
  for (int64_t g = 0; g < group; ++g) {
    float* s = scores + g * num_keys;
    const float top = *std::max_element(s, s + num_keys);
    float total = 0.f;
    for (int64_t j = 0; j < num_keys; ++j) total += (s[j] = std::exp(s[j] - top));
    const float inv = 1.f / total;
    for (int64_t j = 0; j < num_keys; ++j) s[j] *= inv;
  }
  for (int64_t j = 0; j < num_keys; ++j) {
    const T* v = row(v_cache, j);
    for (int64_t g = 0; g < group; ++g) axpy(scores[g * num_keys + j], v, acc + g * dim, dim);
  }
  for (int64_t i = 0; i < group * dim; ++i) out[i] = static_cast<T>(acc[i]);
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
  const Plan plan = plan_tokens(query_start_loc, seq_lens, num_tokens, max_query_len);
  const int64_t rows = static_cast<int64_t>(plan.token.size());
  auto out = at::empty_like(query);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, query.scalar_type(), "paged_attention", [&] {
    const scalar_t* q = query.data_ptr<scalar_t>();
    const scalar_t* k = k_cache.data_ptr<scalar_t>();
    const scalar_t* v = v_cache.data_ptr<scalar_t>();
    scalar_t* o = out.data_ptr<scalar_t>();
    const int64_t* table = tables.data_ptr<int64_t>();
    at::parallel_for(0, rows * kv_heads, 1, [&](int64_t begin, int64_t end) {
      std::vector<float> scratch;
      for (int64_t item = begin; item < end; ++item) {
        const int64_t i = item / kv_heads, h = item % kv_heads;
        const int64_t offset = (plan.token[i] * heads + h * group) * dim;
        attend(q + offset, k, v, table + plan.seq[i] * width, o + offset, plan.position[i], group, dim,
               block_size, kv_heads, h, static_cast<float>(scale), scratch);
      }
    });
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

}  // namespace

TORCH_LIBRARY(pagedq_cpu, m) {
  m.def("paged_attention", &paged_attention);
  m.def("add_rms_norm", &add_rms_norm);
  m.def("silu_and_mul", &silu_and_mul);
  m.def("rotate", &rotate);
}

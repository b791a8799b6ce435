// One decoder layer of a Llama-family model on GGUF-quantized weights, in one call (kernels/cpu.py builds
// this file with the other CPU kernels into torch.ops.pagedq_cpu). It calls the same kernels in the same
// order as worker/engine/model/llama.py's DecoderLayer.forward does one by one from Python, so it returns
// the same bits: what it saves is the dozen Python-level calls a layer (at batch 1 a quarter of a step).
// For steps whose every sequence attends in place (decodes and short chunks); longer prefills gather
// their K/V for SDPA in Python (kernels/cpu.py paged_attention), and take the layer's Python path.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <tuple>

namespace {

template <class Signature>
c10::TypedOperatorHandle<Signature> op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Signature>();
}

// x [T, K] times the weights side by side, as kernels.cpu.quant_linear (the best level this CPU runs).
at::Tensor linear(const at::Tensor& x, at::TensorList weights, at::IntArrayRef types, bool float_x) {
  static const auto quant_linear =
      op<at::Tensor(const at::Tensor&, at::TensorList, at::IntArrayRef, int64_t, bool)>("pagedq_cpu::quant_linear");
  return quant_linear.call(x, weights, types, -1, float_x);
}

std::tuple<at::Tensor, at::Tensor> add_rms_norm(const at::Tensor& x, const at::Tensor& residual,
                                                const at::Tensor& weight, double eps) {
  static const auto kernel =
      op<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&, const at::Tensor&, double)>(
          "pagedq_cpu::add_rms_norm");
  return kernel.call(x, residual, weight, eps);
}

// hidden = (x, residual) as a layer's forward takes them; norms = (input, post-attention) weights; the
// linears' weights and GGML types as GGUFLinear holds them; cos / signed_sin [T, 1, D] (kernels.rotate);
// the step's attention metadata as kernels.cpu.paged_attention passes it. Returns (mlp_out, residual).
std::tuple<at::Tensor, at::Tensor> gguf_decoder_layer(
    const at::Tensor& x, const at::Tensor& residual, const at::Tensor& input_norm, const at::Tensor& post_norm,
    double eps, at::TensorList qkv, at::IntArrayRef qkv_types, const c10::optional<at::Tensor>& qkv_bias,
    at::TensorList o, at::IntArrayRef o_types, at::TensorList gate_up, at::IntArrayRef gate_up_types,
    at::TensorList down, at::IntArrayRef down_types, bool float_x, const at::Tensor& cos,
    const at::Tensor& signed_sin, at::Tensor k_cache, at::Tensor v_cache, const at::Tensor& slot_mapping,
    const at::Tensor& block_tables, const at::Tensor& query_start_loc, const at::Tensor& seq_lens, double scale,
    int64_t max_query, int64_t num_heads, int64_t num_kv_heads) {
  static const auto rotate =
      op<at::Tensor(at::Tensor, const at::Tensor&, const at::Tensor&)>("pagedq_cpu::rotate");
  static const auto write_kv =
      op<void(const at::Tensor&, const at::Tensor&, at::Tensor, at::Tensor, const at::Tensor&)>("pagedq_cpu::write_kv");
  static const auto paged_attention =
      op<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                    const at::Tensor&, double, int64_t)>("pagedq_cpu::paged_attention");
  static const auto silu_and_mul = op<at::Tensor(const at::Tensor&)>("pagedq_cpu::silu_and_mul");
  const int64_t dim = k_cache.size(3), q_size = num_heads * dim, kv_size = num_kv_heads * dim;

  auto [h, res] = add_rms_norm(x, residual, input_norm, eps);
  auto qkv_out = linear(h, qkv, qkv_types, float_x);
  if (qkv_bias.has_value()) qkv_out = qkv_out + *qkv_bias;
  const auto parts = qkv_out.split_with_sizes({q_size + kv_size, kv_size}, -1);
  const auto qk = rotate.call(parts[0].view({-1, num_heads + num_kv_heads, dim}), cos, signed_sin);
  const auto v = parts[1].view({-1, num_kv_heads, dim});
  write_kv.call(qk.narrow(1, num_heads, num_kv_heads), v, k_cache, v_cache, slot_mapping);
  const auto attn = paged_attention.call(qk.narrow(1, 0, num_heads), k_cache, v_cache, block_tables,
                                         query_start_loc, seq_lens, scale, max_query);
  const auto attn_out = linear(attn.reshape({-1, q_size}), o, o_types, float_x);
  auto [h2, res2] = add_rms_norm(attn_out, res, post_norm, eps);
  const auto mlp = linear(silu_and_mul.call(linear(h2, gate_up, gate_up_types, float_x)), down, down_types, float_x);
  return {mlp, res2};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(pagedq_cpu, m) { m.def("gguf_decoder_layer", &gguf_decoder_layer); }

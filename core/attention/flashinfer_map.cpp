// The host-side mapping of a run onto FlashInfer's batch-prefill kernel; see flashinfer_map.hpp.
#include "core/attention/flashinfer_map.hpp"

#include <cstdint>

namespace swiftkv {

namespace {

// FlashInfer's kernels load and store 16 bytes at a time: 8 elements of f16 or bf16.
constexpr int64_t kVectorElems = 8;
constexpr uintptr_t kVectorBytes = 16;

bool fits_u32(int64_t v) { return v >= 1 && v <= int64_t{UINT32_MAX}; }

}  // namespace

std::optional<FlashInferTensors> flashinfer_tensors(const AttentionShape &shape,
                                                    const swiftkv_attention_args &args,
                                                    std::string *why) {
  auto refuse = [&](std::string reason) -> std::optional<FlashInferTensors> {
    if (why != nullptr) *why = std::move(reason);
    return std::nullopt;
  };
  if (shape.dtype != SWIFTKV_DTYPE_F16 && shape.dtype != SWIFTKV_DTYPE_BF16) {
    return refuse("the dtype is neither f16 nor bf16");
  }
  if (shape.head_dim != 64 && shape.head_dim != 128 && shape.head_dim != 256) {
    return refuse("head_dim " + std::to_string(shape.head_dim) + " is not 64, 128 or 256");
  }
  const struct {
    const char *name;
    int64_t value;
  } strides[] = {{"page_stride", args.page_stride},
                 {"token_stride", args.token_stride},
                 {"head_stride", args.head_stride},
                 {"q_token_stride", args.q_token_stride},
                 {"q_head_stride", args.q_head_stride}};
  for (const auto &s : strides) {
    if (!fits_u32(s.value)) {
      return refuse(std::string(s.name) + " " + std::to_string(s.value) +
                    " does not fit FlashInfer's 32-bit strides");
    }
    if (s.value % kVectorElems != 0) {
      return refuse(std::string(s.name) + " " + std::to_string(s.value) +
                    " is not a multiple of 8 elements (16 bytes)");
    }
  }
  const struct {
    const char *name;
    const void *p;
  } bases[] = {{"k_base", args.k_base}, {"v_base", args.v_base}, {"q", args.q}, {"out", args.out}};
  for (const auto &b : bases) {
    if (reinterpret_cast<uintptr_t>(b.p) % kVectorBytes != 0) {
      return refuse(std::string(b.name) + " is not 16-byte aligned");
    }
  }
  // The output is written densely: token t, head h at (t * num_qo_heads + h) * head_dim.
  const int64_t dense_head = shape.head_dim;
  const int64_t dense_token = int64_t{shape.num_qo_heads} * shape.head_dim;
  if (args.out_head_stride != dense_head || args.out_token_stride != dense_token) {
    return refuse("out is not dense [q_tokens, num_qo_heads, head_dim] (strides " +
                  std::to_string(args.out_token_stride) + ", " +
                  std::to_string(args.out_head_stride) + "; FlashInfer writes " +
                  std::to_string(dense_token) + ", " + std::to_string(dense_head) + ")");
  }
  FlashInferTensors t;
  t.page_stride = static_cast<uint32_t>(args.page_stride);
  t.token_stride = static_cast<uint32_t>(args.token_stride);
  t.head_stride = static_cast<uint32_t>(args.head_stride);
  t.q_token_stride = static_cast<uint32_t>(args.q_token_stride);
  t.q_head_stride = static_cast<uint32_t>(args.q_head_stride);
  return t;
}

}  // namespace swiftkv

// The CPU twin: row by row, an online softmax in fp64 over the keys of each work item, read
// through the page table and the strides, then the log-sum-exp merge of split pieces.
#include "core/attention/attention_cpu.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "core/attention/half_float.hpp"
#include "core/common/error.hpp"

namespace swiftkv {

namespace {

struct F16Bits {};
struct BF16Bits {};

template <class T>
struct Element;

template <>
struct Element<F16Bits> {
  static double load(const void *base, int64_t i) {
    return half_to_float(static_cast<const uint16_t *>(base)[i]);
  }
  static void store(void *base, int64_t i, double v) {
    static_cast<uint16_t *>(base)[i] = float_to_half(static_cast<float>(v));
  }
};
template <>
struct Element<BF16Bits> {
  static double load(const void *base, int64_t i) {
    return bf16_to_float(static_cast<const uint16_t *>(base)[i]);
  }
  static void store(void *base, int64_t i, double v) {
    static_cast<uint16_t *>(base)[i] = float_to_bf16(static_cast<float>(v));
  }
};
template <>
struct Element<float> {
  static double load(const void *base, int64_t i) { return static_cast<const float *>(base)[i]; }
  static void store(void *base, int64_t i, double v) {
    static_cast<float *>(base)[i] = static_cast<float>(v);
  }
};

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// One past the last key that query token i of the item's sub-request sees.
int64_t key_limit(const AttentionParams &p, const AttentionWorkItem &w, int64_t i) {
  if (p.causal == 0) return w.kv_len;
  return std::max<int64_t>(0, static_cast<int64_t>(w.kv_len) - w.q_len + i + 1);
}

// Writes one finished row: out and lse, or the piece's partial row.
template <class T>
void finish_row(const AttentionParams &p, const AttentionWorkItem &w, int64_t row,
                const std::vector<double> &acc, double m, double l) {
  const int64_t i = row / p.group;
  const int64_t head = static_cast<int64_t>(w.kv_head) * p.group + row % p.group;
  const bool empty = l == 0.0;
  const double lse = empty ? kNegInf : m + std::log(l);
  if (w.partial >= 0) {
    const int64_t pr = w.partial + row;
    for (int64_t d = 0; d < p.head_dim; ++d) {
      p.partial_o[pr * p.head_dim + d] = empty ? 0.0f : static_cast<float>(acc[d] / l);
    }
    p.partial_lse[pr] = static_cast<float>(lse);
    return;
  }
  const int64_t t = w.q_begin + i;
  for (int64_t d = 0; d < p.head_dim; ++d) {
    Element<T>::store(p.out, t * p.out_token_stride + head * p.out_head_stride + d,
                      empty ? 0.0 : acc[d] / l);
  }
  if (p.lse != nullptr) p.lse[t * p.num_qo_heads + head] = static_cast<float>(lse);
}

template <class T>
void run_items(const AttentionParams &p) {
  std::vector<double> q(p.head_dim), acc(p.head_dim);
  for (int32_t wi = 0; wi < p.n_work; ++wi) {
    const AttentionWorkItem &w = p.work[wi];
    const int64_t rows = static_cast<int64_t>(w.q_len) * p.group;
    const int64_t row_end =
        std::min<int64_t>(rows, static_cast<int64_t>(w.row_begin) + p.tile_rows);
    for (int64_t row = w.row_begin; row < row_end; ++row) {
      const int64_t i = row / p.group;
      const int64_t head = static_cast<int64_t>(w.kv_head) * p.group + row % p.group;
      const int64_t qt = w.q_begin + i;
      for (int64_t d = 0; d < p.head_dim; ++d) {
        q[d] = Element<T>::load(p.q, qt * p.q_token_stride + head * p.q_head_stride + d);
      }
      std::fill(acc.begin(), acc.end(), 0.0);
      double m = kNegInf, l = 0.0;
      const int64_t end = std::min<int64_t>(w.kv_end, key_limit(p, w, i));
      for (int64_t j = w.kv_begin; j < end; ++j) {
        const int64_t page = p.kv_indices[w.page_begin + j / p.page_tokens];
        const int64_t off = page * p.page_stride + (j % p.page_tokens) * p.token_stride +
                            static_cast<int64_t>(w.kv_head) * p.head_stride;
        double s = 0.0;
        for (int64_t d = 0; d < p.head_dim; ++d) s += q[d] * Element<T>::load(p.k, off + d);
        s *= p.sm_scale;
        if (p.soft_cap > 0.0f) s = p.soft_cap * std::tanh(s / p.soft_cap);
        const double m_new = std::max(m, s);
        const double rescale = std::exp(m - m_new);  // 0 for the first key (m = -inf)
        const double e = std::exp(s - m_new);
        l = l * rescale + e;
        for (int64_t d = 0; d < p.head_dim; ++d) {
          acc[d] = acc[d] * rescale + e * Element<T>::load(p.v, off + d);
        }
        m = m_new;
      }
      finish_row<T>(p, w, row, acc, m, l);
    }
  }
}

template <class T>
void run_merges(const AttentionParams &p) {
  std::vector<double> acc(p.head_dim);
  for (int32_t mi = 0; mi < p.n_merge; ++mi) {
    const AttentionMergeItem &g = p.merge[mi];
    const int64_t rows = static_cast<int64_t>(g.q_len) * p.group;
    for (int64_t row = 0; row < rows; ++row) {
      double m = kNegInf;
      for (int32_t k = 0; k < g.pieces; ++k) {
        m = std::max<double>(m, p.partial_lse[g.partial_base + k * rows + row]);
      }
      std::fill(acc.begin(), acc.end(), 0.0);
      double l = 0.0;
      if (m != kNegInf) {
        for (int32_t k = 0; k < g.pieces; ++k) {
          const int64_t pr = g.partial_base + k * rows + row;
          const double wgt = std::exp(static_cast<double>(p.partial_lse[pr]) - m);
          l += wgt;
          for (int64_t d = 0; d < p.head_dim; ++d) acc[d] += wgt * p.partial_o[pr * p.head_dim + d];
        }
      }
      const int64_t t = g.q_begin + row / p.group;
      const int64_t head = static_cast<int64_t>(g.kv_head) * p.group + row % p.group;
      for (int64_t d = 0; d < p.head_dim; ++d) {
        Element<T>::store(p.out, t * p.out_token_stride + head * p.out_head_stride + d,
                          l == 0.0 ? 0.0 : acc[d] / l);
      }
      if (p.lse != nullptr) {
        p.lse[t * p.num_qo_heads + head] = static_cast<float>(l == 0.0 ? kNegInf : m + std::log(l));
      }
    }
  }
}

template <class T>
void run_typed(const AttentionParams &p) {
  run_items<T>(p);
  run_merges<T>(p);
}

}  // namespace

void check_attention_pages(const AttentionParams &p) {
  for (int32_t wi = 0; wi < p.n_work; ++wi) {
    const AttentionWorkItem &w = p.work[wi];
    if (w.kv_len == 0 || w.kv_head != 0 || w.row_begin != 0 || w.kv_begin != 0) continue;
    const int64_t pages = (static_cast<int64_t>(w.kv_len) + p.page_tokens - 1) / p.page_tokens;
    for (int64_t k = 0; k < pages; ++k) {
      const int32_t id = p.kv_indices[w.page_begin + k];
      if (id < 0 || id >= p.num_pages) {
        fail_invalid("kv_indices[" + std::to_string(w.page_begin + k) + "] is " +
                     std::to_string(id) + "; page ids must be in 0.." +
                     std::to_string(p.num_pages - 1) + " (args->num_pages)");
      }
    }
  }
}

void run_attention_cpu(const AttentionShape &shape, const AttentionParams &p) {
  switch (shape.dtype) {
    case SWIFTKV_DTYPE_F16: return run_typed<F16Bits>(p);
    case SWIFTKV_DTYPE_BF16: return run_typed<BF16Bits>(p);
    case SWIFTKV_DTYPE_F32: return run_typed<float>(p);
    default: fail(SWIFTKV_EINTERNAL, "attention: unchecked dtype reached the CPU run");
  }
}

}  // namespace swiftkv

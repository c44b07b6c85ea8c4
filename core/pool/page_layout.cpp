// Layout checks: the library never guesses, so every field is checked against the model and
// against the memory the descriptor says each layer spans.
#include "core/pool/page_layout.hpp"

#include <algorithm>
#include <array>
#include <string>

#include "core/common/checked_math.hpp"
#include "core/common/error.hpp"

namespace swiftkv {

namespace {

struct Dim {
  const char *name;
  int64_t stride;
  uint64_t extent;
};

// Whether an element offset minus another (in elements) can be `d`: d = sum over dims[0..k] of
// stride * t with |t| < extent. The dims are sorted by stride and nested (each stride steps over
// what the smaller ones reach), so at each dimension only the two multiples of its stride that
// leave a remainder inside the smaller ones' reach can work.
bool offsets_differ_by(const std::array<Dim, 5> &dims, int k, int64_t d) {
  if (k < 0) return d == 0;
  const Dim &dim = dims[static_cast<size_t>(k)];
  const auto last = static_cast<int64_t>(dim.extent) - 1;
  if (last == 0) return offsets_differ_by(dims, k - 1, d);
  const int64_t t0 = d >= 0 ? d / dim.stride : -((-d + dim.stride - 1) / dim.stride);
  for (const int64_t t : {t0, t0 + 1}) {
    if (t >= -last && t <= last && offsets_differ_by(dims, k - 1, d - t * dim.stride)) return true;
  }
  return false;
}

}  // namespace

void check_page_layout(const PageLayout &l, const ModelGeometry &g, std::string_view arg) {
  const std::string a(arg);
  if (l.layer_base.size() != g.num_layers) {
    fail_invalid(a + " has " + std::to_string(l.layer_base.size()) +
                 " layer bases; the model has " + std::to_string(g.num_layers) + " layers");
  }
  if (l.page_tokens != g.block_tokens || l.heads != g.num_kv_heads || l.head_dim != g.head_dim ||
      l.dtype_bytes != dtype_size(g.dtype)) {
    fail_invalid(a + " does not match the model's block_tokens, heads, head_dim or dtype");
  }
  if (l.num_pages == 0) fail_invalid(a + "->num_pages is 0");
  if (l.stream_pages != 0 &&
      (l.stream_first >= l.num_pages || l.num_pages - l.stream_first < l.stream_pages)) {
    fail_invalid(a + ": stream pages [" + std::to_string(l.stream_first) + ", " +
                 std::to_string(uint64_t{l.stream_first} + l.stream_pages) +
                 ") are not inside the " + std::to_string(l.num_pages) + " pages");
  }
  std::array<Dim, 5> dims{{{"page_stride", l.page_stride, l.num_pages},
                           {"kv_stride", l.kv_stride, 2},
                           {"token_stride", l.token_stride, l.page_tokens},
                           {"head_stride", l.head_stride, l.heads},
                           {"head dim (stride 1)", 1, l.head_dim}}};
  for (const Dim &d : dims) {
    if (d.stride <= 0)
      fail_invalid(a + "->" + d.name + " is " + std::to_string(d.stride) + ", not > 0");
  }
  // No two elements at one address: sorted by stride, each dimension must step over everything
  // the smaller ones reach. Every layout the library knows satisfies this, and it is cheap.
  std::sort(dims.begin(), dims.end(),
            [](const Dim &x, const Dim &y) { return x.stride < y.stride; });
  uint64_t reach = 1;  // elements spanned by the dimensions seen so far
  const std::string what = a + "'s strides times its extents";
  for (const Dim &d : dims) {
    const auto stride = static_cast<uint64_t>(d.stride);
    if (d.extent > 1 && stride < reach) {
      fail_invalid(a + "->" + d.name + " (" + std::to_string(d.stride) +
                   ") makes elements overlap: the smaller strides span " + std::to_string(reach) +
                   " elements");
    }
    reach = checked_add(checked_mul(stride, d.extent - 1, what), reach, what);
  }
  const uint64_t span_bytes = checked_mul(reach, l.dtype_bytes, what);
  if (span_bytes > l.layer_span_bytes) {
    fail_invalid(a + ": the last element of a layer ends at byte " + std::to_string(span_bytes) +
                 ", past layer_span_bytes (" + std::to_string(l.layer_span_bytes) + ")");
  }
  for (size_t i = 0; i < l.layer_base.size(); ++i) {
    const auto p = reinterpret_cast<uintptr_t>(l.layer_base[i]);
    if (p == 0) fail_invalid(a + "->layer_base[" + std::to_string(i) + "] is NULL");
    if (p % l.dtype_bytes != 0) {
      fail_invalid(a + "->layer_base[" + std::to_string(i) + "] is not aligned to the dtype");
    }
  }
  std::vector<std::byte *> sorted = l.layer_base;
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) {
    fail_invalid(a + ": two layers have the same base");
  }
  // Layers are one lattice of elements at different bases: two meet where their bases differ by
  // a difference of element offsets. Spans may interleave (cross-layer pages), elements may not:
  // a load into one layer would overwrite another's.
  for (size_t i = 0; i < l.layer_base.size(); ++i) {
    for (size_t j = 0; j < l.layer_base.size(); ++j) {
      const auto pi = reinterpret_cast<uintptr_t>(l.layer_base[i]);
      const auto pj = reinterpret_cast<uintptr_t>(l.layer_base[j]);
      if (pj <= pi || pj - pi >= span_bytes) continue;
      const auto d = static_cast<int64_t>((pj - pi) / l.dtype_bytes);
      if ((pj - pi) % l.dtype_bytes == 0 && offsets_differ_by(dims, 4, d)) {
        fail_invalid(a + ": layers " + std::to_string(i) + " and " + std::to_string(j) +
                     " share memory (layer " + std::to_string(j) + " starts " +
                     std::to_string(pj - pi) + " bytes after layer " + std::to_string(i) +
                     ", at one of its elements); only stream pages may alias, and they do so "
                     "by mapping, not by address");
      }
    }
  }
}

PageLayout nhd_layout(const ModelGeometry &g, uint32_t num_pages) {
  PageLayout l;
  l.num_pages = num_pages;
  l.page_tokens = g.block_tokens;
  l.heads = g.num_kv_heads;
  l.head_dim = g.head_dim;
  l.dtype_bytes = dtype_size(g.dtype);
  l.device = g.device;
  l.head_stride = g.head_dim;
  l.token_stride = int64_t{g.num_kv_heads} * g.head_dim;
  l.kv_stride = l.token_stride * g.block_tokens;
  l.page_stride = 2 * l.kv_stride;
  l.layer_span_bytes = static_cast<uint64_t>(l.page_stride) * num_pages * l.dtype_bytes;
  return l;
}

}  // namespace swiftkv

/* A paged-attention problem for the tests: random K/V and queries rounded to the dtype, kept
 * logically per sub-request for a naive fp64 reference, and scattered into pages of a chosen
 * layout in random page order. C11 and C++ alike (the GPU test reuses it). */
#ifndef SWIFTKV_ATTENTION_FIXTURE_H
#define SWIFTKV_ATTENTION_FIXTURE_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "swiftkv/swiftkv.h"

enum att_layout { ATT_NHD, ATT_HND, ATT_VLLM, ATT_CROSS_LAYER, ATT_PADDED, ATT_LAYOUTS };

#define ATT_MAX_REQ 8

typedef struct att_problem {
  swiftkv_attention_desc desc;
  enum att_layout layout;
  uint32_t n_req;
  int32_t q_len[ATT_MAX_REQ];
  int32_t kv_len[ATT_MAX_REQ];
  /* the page table */
  int32_t qo_indptr[ATT_MAX_REQ + 1];
  int32_t kv_indptr[ATT_MAX_REQ + 1];
  int32_t last_page_len[ATT_MAX_REQ];
  int32_t *kv_indices;
  uint32_t num_pages;
  /* logical values, already rounded to the dtype: q [tokens][hq][D], k/v per sub-request
   * [kv_len][hkv][D] at kv_off[r] */
  double *q_ref, *k_ref, *v_ref;
  int64_t kv_off[ATT_MAX_REQ];
  int32_t q_tokens;
  /* the tensors as the library sees them */
  size_t elem;
  unsigned char *q, *kv, *out;
  size_t q_bytes, kv_bytes, out_bytes;
  swiftkv_attention_args args;
  float *lse;
} att_problem;

static inline uint64_t att_rand(uint64_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

static inline double att_uniform(uint64_t *s) { /* [-1, 1) */
  return (double)(att_rand(s) >> 11) * (2.0 / 9007199254740992.0) - 1.0;
}

static inline uint16_t att_f32_to_bf16(float f) {
  uint32_t b;
  memcpy(&b, &f, 4);
  return (uint16_t)((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
}

static inline float att_bf16_to_f32(uint16_t h) {
  uint32_t b = (uint32_t)h << 16;
  float f;
  memcpy(&f, &b, 4);
  return f;
}

#ifdef __FLT16_MAX__
typedef _Float16 att_f16;
static inline att_f16 att_to_f16(float f) { return (att_f16)f; }
static inline double att_from_f16(att_f16 h) { return (double)h; }
#else
/* Compilers without _Float16 on this target (clang 14 on x86-64): IEEE binary16 by hand,
 * rounding to nearest even as the conversion instruction does. */
typedef uint16_t att_f16;
static inline att_f16 att_to_f16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  const uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
  x &= 0x7fffffffu;
  if (x >= 0x7f800000u) return (uint16_t)(sign | 0x7c00u | (x > 0x7f800000u ? 0x200u : 0u));
  if (x >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* rounds past 65504 */
  if (x < 0x38800000u) { /* a subnormal half: a multiple of 2^-24, exact scaling then rint */
    return (uint16_t)(sign | (uint16_t)lrintf(fabsf(f) * 16777216.0f));
  }
  x += 0xc8000000u; /* exponent bias 127 -> 15 */
  return (uint16_t)(sign | ((x + 0xfffu + ((x >> 13) & 1u)) >> 13));
}
static inline double att_from_f16(att_f16 h) {
  const int e = (h >> 10) & 0x1f, m = h & 0x3ff;
  const double v = e == 0    ? ldexp(m, -24)
                   : e == 31 ? (m ? NAN : INFINITY)
                             : ldexp(m + 1024, e - 25);
  return (h & 0x8000u) ? -v : v;
}
#endif

/* Rounds v to the dtype and stores it at dst; returns the rounded value. */
static inline double att_store(swiftkv_dtype t, void *dst, double v) {
  if (t == SWIFTKV_DTYPE_F16) {
    att_f16 h = att_to_f16((float)v);
    memcpy(dst, &h, 2);
    return att_from_f16(h);
  }
  if (t == SWIFTKV_DTYPE_BF16) {
    uint16_t b = att_f32_to_bf16((float)v);
    memcpy(dst, &b, 2);
    return att_bf16_to_f32(b);
  }
  float f = (float)v;
  memcpy(dst, &f, 4);
  return f;
}

static inline double att_load(swiftkv_dtype t, const void *src) {
  if (t == SWIFTKV_DTYPE_F16) {
    att_f16 h;
    memcpy(&h, src, 2);
    return att_from_f16(h);
  }
  if (t == SWIFTKV_DTYPE_BF16) {
    uint16_t b;
    memcpy(&b, src, 2);
    return att_bf16_to_f32(b);
  }
  float f;
  memcpy(&f, src, 4);
  return f;
}

/* One unit in the last place of the dtype at |x|. */
static inline double att_ulp(swiftkv_dtype t, double x) {
  const int mant = t == SWIFTKV_DTYPE_F16 ? 10 : t == SWIFTKV_DTYPE_BF16 ? 7 : 23;
  const int min_exp = t == SWIFTKV_DTYPE_F16 ? -14 : -126;
  int e = x == 0.0 ? min_exp : (int)floor(log2(fabs(x)));
  if (e < min_exp) e = min_exp;
  return ldexp(1.0, e - mant);
}

/* The ragged batch both sweeps use: a decode step over up to decode_kv keys, an empty
 * sub-request (with or without pages), a prefill of up to prefill_q tokens over up to
 * prefill_extra cached ones, and a fresh prefill of up to 20 tokens. */
static inline void att_ragged_batch(att_problem *p, uint64_t *s, int32_t decode_kv,
                                    int32_t prefill_q, int32_t prefill_extra) {
  p->n_req = 4;
  p->q_len[0] = 1;
  p->kv_len[0] = 1 + (int32_t)(att_rand(s) % (uint64_t)decode_kv);
  p->q_len[1] = 0;
  p->kv_len[1] = (int32_t)(att_rand(s) % 40);
  p->q_len[2] = 1 + (int32_t)(att_rand(s) % (uint64_t)prefill_q);
  p->kv_len[2] = p->q_len[2] + (int32_t)(att_rand(s) % (uint64_t)prefill_extra);
  p->q_len[3] = 1 + (int32_t)(att_rand(s) % 20);
  p->kv_len[3] = p->q_len[3];
}

/* Sets the strides of `layout` for num_pages pages; returns the elements of the KV buffer. */
static inline size_t att_layout_strides(att_problem *p, int64_t *k_off, int64_t *v_off) {
  const int64_t pt = p->desc.page_tokens, h = p->desc.num_kv_heads, d = p->desc.head_dim;
  const int64_t np = p->num_pages;
  swiftkv_attention_args *a = &p->args;
  switch (p->layout) {
    case ATT_NHD: /* [pages, 2, B, H, D] */
      a->page_stride = 2 * pt * h * d;
      a->token_stride = h * d;
      a->head_stride = d;
      *k_off = 0;
      *v_off = pt * h * d;
      return (size_t)(np * 2 * pt * h * d);
    case ATT_HND: /* [pages, 2, H, B, D] */
      a->page_stride = 2 * pt * h * d;
      a->token_stride = d;
      a->head_stride = pt * d;
      *k_off = 0;
      *v_off = pt * h * d;
      return (size_t)(np * 2 * pt * h * d);
    case ATT_VLLM: /* [2, pages, B, H, D] */
      a->page_stride = pt * h * d;
      a->token_stride = h * d;
      a->head_stride = d;
      *k_off = 0;
      *v_off = np * pt * h * d;
      return (size_t)(2 * np * pt * h * d);
    case ATT_CROSS_LAYER: /* [pages, 3 layers, 2, B, H, D], layer 1 */
      a->page_stride = 3 * 2 * pt * h * d;
      a->token_stride = h * d;
      a->head_stride = d;
      *k_off = 2 * pt * h * d;
      *v_off = *k_off + pt * h * d;
      return (size_t)(np * 3 * 2 * pt * h * d);
    default: /* padded NHD: every head row 8 elements longer, K and V apart by an odd gap */
      a->head_stride = d + 8;
      a->token_stride = h * (d + 8);
      a->page_stride = pt * h * (d + 8);
      *k_off = 0;
      *v_off = np * pt * h * (d + 8) + 24;
      return (size_t)(*v_off + np * pt * h * (d + 8));
  }
}

/* Builds the problem: sub-request lengths must be set in p->q_len / p->kv_len / p->n_req and
 * p->desc, p->layout filled. Pages are assigned in random order with `extra` unused ones. */
static inline void att_build(att_problem *p, uint64_t seed, uint32_t extra_pages) {
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  const int32_t pt = (int32_t)p->desc.page_tokens;
  const int64_t hq = p->desc.num_qo_heads, hk = p->desc.num_kv_heads, d = p->desc.head_dim;
  const swiftkv_dtype t = p->desc.dtype;
  p->elem = swiftkv_dtype_size(t);
  p->qo_indptr[0] = 0;
  p->kv_indptr[0] = 0;
  int64_t kv_total = 0;
  for (uint32_t r = 0; r < p->n_req; ++r) {
    const int32_t pages = (p->kv_len[r] + pt - 1) / pt;
    p->qo_indptr[r + 1] = p->qo_indptr[r] + p->q_len[r];
    p->kv_indptr[r + 1] = p->kv_indptr[r] + pages;
    p->last_page_len[r] = pages == 0 ? 0 : p->kv_len[r] - (pages - 1) * pt;
    p->kv_off[r] = kv_total;
    kv_total += p->kv_len[r];
  }
  p->q_tokens = p->qo_indptr[p->n_req];
  const int32_t used = p->kv_indptr[p->n_req];
  p->num_pages = (uint32_t)used + extra_pages;
  /* A random permutation of all pages; the first `used` become the page table. */
  int32_t *perm = (int32_t *)malloc(sizeof(int32_t) * (p->num_pages + 1));
  for (uint32_t i = 0; i < p->num_pages; ++i) perm[i] = (int32_t)i;
  for (uint32_t i = p->num_pages; i > 1; --i) {
    const uint32_t j = (uint32_t)(att_rand(&s) % i);
    const int32_t tmp = perm[i - 1];
    perm[i - 1] = perm[j];
    perm[j] = tmp;
  }
  p->kv_indices = perm;

  swiftkv_attention_args init = SWIFTKV_ATTENTION_ARGS_INIT;
  p->args = init;
  int64_t k_off = 0, v_off = 0;
  const size_t kv_elems = att_layout_strides(p, &k_off, &v_off);
  p->kv_bytes = kv_elems * p->elem + 64;
  p->kv = (unsigned char *)calloc(1, p->kv_bytes);
  /* Unused memory holds large values: a read of the wrong element shows. */
  for (size_t i = 0; i < kv_elems; ++i) att_store(t, p->kv + i * p->elem, 1000.0);

  p->k_ref = (double *)malloc(sizeof(double) * (size_t)(kv_total * hk * d + 1));
  p->v_ref = (double *)malloc(sizeof(double) * (size_t)(kv_total * hk * d + 1));
  for (uint32_t r = 0; r < p->n_req; ++r) {
    for (int32_t j = 0; j < p->kv_len[r]; ++j) {
      const int64_t page = p->kv_indices[p->kv_indptr[r] + j / pt];
      for (int64_t h = 0; h < hk; ++h) {
        for (int64_t e = 0; e < d; ++e) {
          const int64_t at = page * p->args.page_stride + (j % pt) * p->args.token_stride +
                             h * p->args.head_stride + e;
          const int64_t li = ((p->kv_off[r] + j) * hk + h) * d + e;
          p->k_ref[li] = att_store(t, p->kv + (size_t)(k_off + at) * p->elem, att_uniform(&s));
          p->v_ref[li] = att_store(t, p->kv + (size_t)(v_off + at) * p->elem, att_uniform(&s));
        }
      }
    }
  }
  p->args.k_base = p->kv + (size_t)k_off * p->elem;
  p->args.v_base = p->kv + (size_t)v_off * p->elem;
  p->args.num_pages = p->num_pages;
  p->args.kv_indices = p->kv_indices;

  /* Queries and outputs with padded strides. */
  const int64_t q_head = p->layout == ATT_PADDED ? d + 8 : d;
  p->args.q_head_stride = q_head;
  p->args.q_token_stride = hq * q_head;
  p->args.out_head_stride = d;
  p->args.out_token_stride = hq * d + (p->layout == ATT_PADDED ? 16 : 0);
  p->q_bytes = (size_t)(p->q_tokens * hq * q_head + 8) * p->elem;
  p->q = (unsigned char *)calloc(1, p->q_bytes);
  p->q_ref = (double *)malloc(sizeof(double) * (size_t)(p->q_tokens * hq * d + 1));
  for (int64_t i = 0; i < p->q_tokens; ++i) {
    for (int64_t h = 0; h < hq; ++h) {
      for (int64_t e = 0; e < d; ++e) {
        p->q_ref[(i * hq + h) * d + e] =
            att_store(t, p->q + (size_t)(i * p->args.q_token_stride + h * q_head + e) * p->elem,
                      att_uniform(&s));
      }
    }
  }
  p->out_bytes = (size_t)(p->q_tokens * p->args.out_token_stride + 8) * p->elem;
  p->out = (unsigned char *)calloc(1, p->out_bytes);
  p->lse = (float *)calloc((size_t)(p->q_tokens * hq + 1), sizeof(float));
  p->args.q = p->q;
  p->args.out = p->out;
  p->args.lse = p->lse;
}

static inline void att_free(att_problem *p) {
  free(p->kv_indices);
  free(p->q_ref);
  free(p->k_ref);
  free(p->v_ref);
  free(p->q);
  free(p->kv);
  free(p->out);
  free(p->lse);
}

/* The naive reference for (query token t of sub-request r, head h): fp64 over the logical
 * values. Writes head_dim outputs and returns the lse (-INFINITY when no key is seen). */
static inline double att_reference(const att_problem *p, uint32_t r, int32_t i, int64_t h,
                                   double *o) {
  const int64_t hq = p->desc.num_qo_heads, hk = p->desc.num_kv_heads, d = p->desc.head_dim;
  const int64_t kh = h / (hq / hk);
  /* The scale is a float, as the description carries it. */
  const double scale =
      p->desc.sm_scale > 0 ? p->desc.sm_scale : (double)(float)(1.0 / sqrt((double)d));
  const double cap = p->desc.logits_soft_cap;
  int64_t limit = p->kv_len[r];
  if (p->desc.causal) {
    limit = (int64_t)p->kv_len[r] - p->q_len[r] + i + 1;
    if (limit < 0) limit = 0;
  }
  const double *q = p->q_ref + ((int64_t)(p->qo_indptr[r] + i) * hq + h) * d;
  double m = -INFINITY;
  double *sc = (double *)malloc(sizeof(double) * (size_t)(limit + 1));
  for (int64_t j = 0; j < limit; ++j) {
    const double *k = p->k_ref + ((p->kv_off[r] + j) * hk + kh) * d;
    double dot = 0;
    for (int64_t e = 0; e < d; ++e) dot += q[e] * k[e];
    double x = dot * scale;
    if (cap > 0) x = cap * tanh(x / cap);
    sc[j] = x;
    if (x > m) m = x;
  }
  for (int64_t e = 0; e < d; ++e) o[e] = 0;
  double l = 0;
  for (int64_t j = 0; j < limit; ++j) {
    const double w = exp(sc[j] - m);
    l += w;
    const double *v = p->v_ref + ((p->kv_off[r] + j) * hk + kh) * d;
    for (int64_t e = 0; e < d; ++e) o[e] += w * v[e];
  }
  free(sc);
  if (limit == 0) return -INFINITY;
  for (int64_t e = 0; e < d; ++e) o[e] /= l;
  return m + log(l);
}

/* A zeroed problem with a description on the host and a layout; lengths come next, then
 * att_build. */
static inline void att_start(att_problem *p, uint32_t hq, uint32_t hkv, uint32_t dim, uint32_t page,
                             enum att_layout layout) {
  memset(p, 0, sizeof *p);
  swiftkv_attention_desc desc = SWIFTKV_ATTENTION_DESC_INIT;
  desc.num_qo_heads = hq;
  desc.num_kv_heads = hkv;
  desc.head_dim = dim;
  desc.page_tokens = page;
  p->desc = desc;
  p->layout = layout;
}

/* Case c of the kernel sweeps (the GPU test's and the emulated one's): dtype, head dim, GQA,
 * page size, layout, causal mode, soft cap and explicit splits by turns, a ragged batch of the
 * given sizes (att_ragged_batch), built. */
static inline void att_sweep_case(att_problem *p, int c, uint64_t *s, int32_t decode_kv,
                                  int32_t prefill_q, int32_t prefill_extra) {
  static const uint32_t dims[] = {64, 128, 256};
  static const uint32_t groups[][2] = {{4, 4}, {8, 2}, {8, 1}, {6, 3}};
  static const uint32_t pages[] = {1, 3, 16, 64, 256};
  static const swiftkv_dtype types[] = {SWIFTKV_DTYPE_F16, SWIFTKV_DTYPE_BF16};
  att_start(p, groups[(c / 3) % 4][0], groups[(c / 3) % 4][1], dims[c % 3], pages[c % 5],
            (enum att_layout)(c % ATT_LAYOUTS));
  p->desc.dtype = types[(c / 3 + c / 7) % 2];
  p->desc.causal = (uint32_t)(c % 2);
  p->desc.kv_chunk_tokens = (c % 4 == 3) ? 48 : 0;
  if (c % 9 == 0) {
    p->desc.sm_scale = 1.0f;
    p->desc.logits_soft_cap = 5.0f;
  }
  att_ragged_batch(p, s, decode_kv, prefill_q, prefill_extra);
  att_build(p, (uint64_t)c + 100, 3);
}

/* Elements of a kernel run's (out, lse) outside the tolerance of the CPU twin's (want_out,
 * want_lse): fp32 accumulation with P rounded to the dtype before P.V, against fp64. Written as
 * "not within", so that a NaN (what a run left unwritten) counts. Prints the first few. */
static inline int att_mismatches(const att_problem *p, const unsigned char *out, const float *lse,
                                 const unsigned char *want_out, const float *want_lse,
                                 const char *what) {
  const int bf16 = p->desc.dtype == SWIFTKV_DTYPE_BF16;
  const double atol = bf16 ? 1.6e-2 : 2e-3, rtol = bf16 ? 2e-2 : 1e-2;
  int bad = 0;
  const int64_t hq = p->desc.num_qo_heads, dim = p->desc.head_dim;
  for (int64_t t = 0; t < p->q_tokens; ++t) {
    for (int64_t h = 0; h < hq; ++h) {
      const float a = lse[t * hq + h], b = want_lse[t * hq + h];
      if (isinf(b) ? !(isinf(a) && a < 0) : !(fabs(a - b) <= 1e-3 * fmax(1.0, fabs(b)))) {
        if (bad++ < 3)
          fprintf(stderr, "%s: lse t%ld h%ld %g vs %g\n", what, (long)t, (long)h, a, b);
      }
      for (int64_t e = 0; e < dim; ++e) {
        const size_t at =
            (size_t)(t * p->args.out_token_stride + h * p->args.out_head_stride + e) * p->elem;
        const double x = att_load(p->desc.dtype, out + at),
                     y = att_load(p->desc.dtype, want_out + at);
        if (!(fabs(x - y) <= atol + rtol * fabs(y))) {
          if (bad++ < 3) {
            fprintf(stderr, "%s: out t%ld h%ld d%ld %g vs %g\n", what, (long)t, (long)h, (long)e, x,
                    y);
          }
        }
      }
    }
  }
  return bad;
}

#endif /* SWIFTKV_ATTENTION_FIXTURE_H */

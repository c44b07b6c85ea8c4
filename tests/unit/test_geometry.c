/* Model geometry: SwiftCache Table 2's per-token KV sizes, the minimum elastic unit (Eq. 6-9) for
 * mixed geometries, and every way a descriptor can be wrong, with outputs left untouched. */
#include "test_support.h"

static uint64_t bytes_per_token(swiftkv_model_desc m) {
  uint64_t out = SENTINEL;
  assert_ok(swiftkv_geometry_bytes_per_token(&m, &out));
  return out;
}

static void table2_bytes_per_token(void **state) {
  (void)state;
  /* 2 * L * H_kv * D * 2 bytes. Table 2 prints MiB to three digits. */
  assert_int_equal(bytes_per_token(lwm_1m_text()), 524288); /* 0.50 MB */
  assert_int_equal(bytes_per_token(qwen3_8b()), 147456);    /* 0.141 MB */
  assert_int_equal(bytes_per_token(qwen3_14b()), 163840);   /* 0.156 MB */
  assert_int_equal(bytes_per_token(qwen3_32b()), 262144);   /* 0.25 MB */
  assert_int_equal((bytes_per_token(qwen3_8b()) * 1000 + (1 << 19)) >> 20, 141);
  assert_int_equal((bytes_per_token(qwen3_14b()) * 1000 + (1 << 19)) >> 20, 156);
}

static void bytes_per_token_follows_dtype_and_ignores_blocks(void **state) {
  (void)state;
  swiftkv_model_desc m = qwen3_8b();
  static const struct {
    swiftkv_dtype dtype;
    uint32_t bytes;
  } dt[] = {{SWIFTKV_DTYPE_F16, 2},      {SWIFTKV_DTYPE_BF16, 2},     {SWIFTKV_DTYPE_F32, 4},
            {SWIFTKV_DTYPE_FP8_E4M3, 1}, {SWIFTKV_DTYPE_FP8_E5M2, 1}, {SWIFTKV_DTYPE_I8, 1}};
  for (size_t i = 0; i < sizeof dt / sizeof dt[0]; ++i) {
    m.dtype = dt[i].dtype;
    assert_int_equal(swiftkv_dtype_size(dt[i].dtype), dt[i].bytes);
    assert_int_equal(bytes_per_token(m), 2ull * 36 * 8 * 128 * dt[i].bytes);
  }
  assert_int_equal(swiftkv_dtype_size((swiftkv_dtype)6), 0);
  m = qwen3_8b();
  m.block_tokens = 32;
  m.chunk_tokens = 32;
  assert_int_equal(bytes_per_token(m), 147456);
}

static void meu_case(swiftkv_model_desc b, swiftkv_model_desc l, uint64_t want_b, uint64_t want_l) {
  uint64_t mb = SENTINEL, ml = SENTINEL;
  assert_ok(swiftkv_geometry_meu(&b, &l, &mb, &ml));
  assert_int_equal(mb, want_b);
  assert_int_equal(ml, want_l);
  /* The point of the MEU: both sides step by the same number of bytes. */
  uint64_t tb = bytes_per_token(b), tl = bytes_per_token(l);
  assert_int_equal(mb * b.block_tokens * tb, ml * l.block_tokens * tl);
}

static void meu_for_mixed_geometries(void **state) {
  (void)state;
  /* BE = L*B*H*D: 14B 40*16*1024 = 5*2^17, 8B 36*16*1024 = 9*2^16 -> lcm 45*2^17. */
  meu_case(qwen3_14b(), qwen3_8b(), 9, 10);
  meu_case(qwen3_8b(), qwen3_14b(), 10, 9);
  /* LWM 2^21 against 32B 2^20. */
  meu_case(lwm_1m_text(), qwen3_32b(), 1, 2);
  /* 32B 2^20 against 14B 5*2^17 -> lcm 5*2^20. */
  meu_case(qwen3_32b(), qwen3_14b(), 5, 8);
  /* Same model: one block each. */
  meu_case(qwen3_8b(), qwen3_8b(), 1, 1);
  /* Different block sizes of one model. */
  swiftkv_model_desc big_blocks = qwen3_8b();
  big_blocks.block_tokens = 32;
  meu_case(qwen3_8b(), big_blocks, 2, 1);
  /* Coprime element counts: BE 15 and 14 -> lcm 210. */
  meu_case(model(3, 1, 5, 1), model(7, 1, 2, 1), 14, 15);
}

static void meu_across_dtypes_is_byte_aligned(void **state) {
  (void)state;
  /* Eq. 9 on elements would say 1:1, but an FP8 block is half the bytes of an F16 block; the
   * library aligns bytes, which equals Eq. 9 when the dtypes agree. */
  swiftkv_model_desc fp8 = qwen3_8b();
  fp8.dtype = SWIFTKV_DTYPE_FP8_E4M3;
  meu_case(qwen3_8b(), fp8, 1, 2);
  swiftkv_model_desc f32 = qwen3_14b();
  f32.dtype = SWIFTKV_DTYPE_F32;
  meu_case(f32, qwen3_8b(), 9, 20);
}

static void meu_without_lcm_overflow(void **state) {
  (void)state;
  /* Per-block bytes near 2^62 and coprime-ish: the lcm does not fit in 64 bits, the MEUs do. */
  swiftkv_model_desc a = model(UINT32_MAX, 1, 1, 1); /* 2*(2^32-1)*2 bytes per block */
  a.chunk_tokens = 1;
  swiftkv_model_desc b = model(UINT32_MAX - 2, 1, 1, 1);
  b.chunk_tokens = 1;
  meu_case(a, b, UINT32_MAX - 2, UINT32_MAX);
}

static void bad_descriptor(swiftkv_model_desc m, swiftkv_status want, const char *needle) {
  uint64_t out = SENTINEL;
  assert_status(swiftkv_geometry_bytes_per_token(&m, &out), want);
  assert_message_contains(needle);
  assert_true(out == SENTINEL);
  /* The same descriptor is refused as either side of the MEU, naming that side. */
  swiftkv_model_desc good = qwen3_8b();
  uint64_t mb = SENTINEL, ml = SENTINEL;
  assert_status(swiftkv_geometry_meu(&m, &good, &mb, &ml), want);
  assert_message_contains("borrower");
  assert_status(swiftkv_geometry_meu(&good, &m, &mb, &ml), want);
  assert_message_contains("lender");
  assert_true(mb == SENTINEL && ml == SENTINEL);
}

static void every_bad_field_is_refused(void **state) {
  (void)state;
  swiftkv_model_desc m;
  m = qwen3_8b();
  m.num_layers = 0;
  bad_descriptor(m, SWIFTKV_EINVAL, "num_layers is 0");
  m = qwen3_8b();
  m.num_kv_heads = 0;
  bad_descriptor(m, SWIFTKV_EINVAL, "num_kv_heads is 0");
  m = qwen3_8b();
  m.head_dim = 0;
  bad_descriptor(m, SWIFTKV_EINVAL, "head_dim is 0");
  m = qwen3_8b();
  m.block_tokens = 0;
  bad_descriptor(m, SWIFTKV_EINVAL, "block_tokens is 0");
  m = qwen3_8b();
  m.chunk_tokens = 0;
  bad_descriptor(m, SWIFTKV_EINVAL, "chunk_tokens is 0");
  m = qwen3_8b();
  m.chunk_tokens = 250;
  bad_descriptor(m, SWIFTKV_EINVAL, "chunk_tokens (250) is not a multiple of block_tokens (16)");
  m = qwen3_8b();
  m.dtype = (swiftkv_dtype)42;
  bad_descriptor(m, SWIFTKV_EINVAL, "dtype (42)");
  m = qwen3_8b();
  m.device = -2;
  bad_descriptor(m, SWIFTKV_EINVAL, "device (-2)");
}

static void overflow_is_refused(void **state) {
  (void)state;
  /* Every dimension at its maximum: bytes per token alone needs 2^97. */
  swiftkv_model_desc m = model(UINT32_MAX, UINT32_MAX, UINT32_MAX, 1);
  m.chunk_tokens = 1;
  bad_descriptor(m, SWIFTKV_EINVAL, "does not fit in 64 bits");
  /* Bytes per token (2^43) and one layer of a 2^21-token chunk (2^48) fit; all 2^16 layers of
   * it (2^64) do not. */
  m = model(1u << 16, 1u << 16, 1u << 8, 1);
  m.dtype = SWIFTKV_DTYPE_F32;
  m.chunk_tokens = 1u << 21;
  bad_descriptor(m, SWIFTKV_EINVAL, "bytes of one full chunk does not fit in 64 bits");
  /* One token less per chunk and it is valid again. */
  m.chunk_tokens = (1u << 21) - 1;
  assert_int_equal(bytes_per_token(m), UINT64_C(1) << 43);
}

static void null_arguments(void **state) {
  (void)state;
  swiftkv_model_desc m = qwen3_8b();
  uint64_t out = SENTINEL, o2 = SENTINEL;
  assert_status(swiftkv_geometry_bytes_per_token(NULL, &out), SWIFTKV_EINVAL);
  assert_message_contains("m is NULL");
  assert_status(swiftkv_geometry_bytes_per_token(&m, NULL), SWIFTKV_EINVAL);
  assert_message_contains("out is NULL");
  assert_status(swiftkv_geometry_meu(NULL, &m, &out, &o2), SWIFTKV_EINVAL);
  assert_message_contains("borrower is NULL");
  assert_status(swiftkv_geometry_meu(&m, NULL, &out, &o2), SWIFTKV_EINVAL);
  assert_message_contains("lender is NULL");
  assert_status(swiftkv_geometry_meu(&m, &m, NULL, &o2), SWIFTKV_EINVAL);
  assert_status(swiftkv_geometry_meu(&m, &m, &out, NULL), SWIFTKV_EINVAL);
  assert_true(out == SENTINEL && o2 == SENTINEL);
}

static void struct_size_and_version(void **state) {
  (void)state;
  uint64_t out = SENTINEL;
  swiftkv_model_desc m = qwen3_8b();
  m.size = 0;
  m.version = 0;
  assert_status(swiftkv_geometry_bytes_per_token(&m, &out), SWIFTKV_EVERSION);
  assert_message_contains("SWIFTKV_MODEL_DESC_INIT");
  m = qwen3_8b();
  m.version = SWIFTKV_MODEL_DESC_VERSION + 1;
  assert_status(swiftkv_geometry_bytes_per_token(&m, &out), SWIFTKV_EVERSION);
  assert_message_contains("m->version is 3");
  m = qwen3_8b();
  m.version = 0;
  assert_status(swiftkv_geometry_bytes_per_token(&m, &out), SWIFTKV_EVERSION);
  /* The smallest version-1 struct ends at `device`, before any tail padding. */
  const uint32_t v1 = (uint32_t)(offsetof(swiftkv_model_desc, device) + sizeof(int32_t));
  m = qwen3_8b();
  m.size = v1 - 1;
  assert_status(swiftkv_geometry_bytes_per_token(&m, &out), SWIFTKV_EVERSION);
  assert_message_contains("m->size");
  assert_true(out == SENTINEL);
  m.size = v1;
  assert_ok(swiftkv_geometry_bytes_per_token(&m, &out));
  assert_int_equal(out, 147456);
}

static void default_block_and_chunk(void **state) {
  (void)state;
  swiftkv_model_desc m = SWIFTKV_MODEL_DESC_INIT;
  assert_int_equal(m.size, sizeof(swiftkv_model_desc));
  assert_int_equal(m.version, SWIFTKV_MODEL_DESC_VERSION);
  assert_int_equal(m.block_tokens, 16);
  assert_int_equal(m.chunk_tokens, 256);
  assert_int_equal(m.dtype, SWIFTKV_DTYPE_F16);
  assert_int_equal(m.device, SWIFTKV_DEVICE_HOST);
  assert_null(m.name);
  /* Geometry left at zero is refused rather than guessed. */
  uint64_t out = SENTINEL;
  assert_status(swiftkv_geometry_bytes_per_token(&m, &out), SWIFTKV_EINVAL);
  assert_true(out == SENTINEL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(table2_bytes_per_token),
      cmocka_unit_test(bytes_per_token_follows_dtype_and_ignores_blocks),
      cmocka_unit_test(meu_for_mixed_geometries),
      cmocka_unit_test(meu_across_dtypes_is_byte_aligned),
      cmocka_unit_test(meu_without_lcm_overflow),
      cmocka_unit_test(every_bad_field_is_refused),
      cmocka_unit_test(overflow_is_refused),
      cmocka_unit_test(null_arguments),
      cmocka_unit_test(struct_size_and_version),
      cmocka_unit_test(default_block_and_chunk),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

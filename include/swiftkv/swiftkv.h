/*
 * swiftkv.h: the public C ABI of libswiftkv, the KV-cache memory layer that lets co-located LLMs
 * lend and borrow KV memory. Pure C11; needs no CUDA header (streams are passed as void*).
 *
 * Conventions (docs/api.md has the full reference):
 *  - Every call returns a swiftkv_status. SWIFTKV_OK and SWIFTKV_IN_PROGRESS are not errors; every
 *    error is negative. After a failing call, swiftkv_last_error_message() says what was wrong with
 *    which argument; outputs are left untouched by every failing call.
 *  - Versioned structs start with `size` and `version`; initialise them with their SWIFTKV_*_INIT
 *    macro. They only ever grow at the end: the library reads min(size, sizeof) bytes and fills
 *    defaults for fields a caller built against an older header does not know.
 *  - Opaque handles are made by *_create(&out, ...) and ended by *_destroy, which accepts NULL.
 */
#ifndef SWIFTKV_SWIFTKV_H
#define SWIFTKV_SWIFTKV_H

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#  define SWIFTKV_API_EXPORT __declspec(dllexport)
#  define SWIFTKV_API_IMPORT __declspec(dllimport)
#else
#  define SWIFTKV_API_EXPORT __attribute__((visibility("default")))
#  define SWIFTKV_API_IMPORT __attribute__((visibility("default")))
#endif
#if defined(SWIFTKV_BUILDING_LIBRARY)
#  define SWIFTKV_API SWIFTKV_API_EXPORT
#else
#  define SWIFTKV_API SWIFTKV_API_IMPORT
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------------------
 * Versions. The soname (libswiftkv.so.MAJOR while the ABI is 0.x: libswiftkv.so.0) changes only
 * when the ABI breaks; these say which release a program was compiled against and which it runs.
 * ------------------------------------------------------------------------------------------- */
#define SWIFTKV_VERSION_MAJOR 0
#define SWIFTKV_VERSION_MINOR 1
#define SWIFTKV_VERSION_PATCH 0
/* MAJOR * 10000 + MINOR * 100 + PATCH, comparable with swiftkv_version(). */
#define SWIFTKV_VERSION_NUMBER \
  (SWIFTKV_VERSION_MAJOR * 10000 + SWIFTKV_VERSION_MINOR * 100 + SWIFTKV_VERSION_PATCH)

/* The version of the library in use at run time, encoded like SWIFTKV_VERSION_NUMBER. */
SWIFTKV_API uint32_t swiftkv_version(void);
/* The same as static text, "MAJOR.MINOR.PATCH". */
SWIFTKV_API const char *swiftkv_version_string(void);

/* ---------------------------------------------------------------------------------------------
 * Status codes. The numbers are pinned: they never change meaning between releases.
 * ------------------------------------------------------------------------------------------- */
typedef enum swiftkv_status {
  SWIFTKV_OK = 0,            /* success */
  SWIFTKV_IN_PROGRESS = 1,   /* accepted and still running; not an error */
  SWIFTKV_EINVAL = -1,       /* an argument is invalid: NULL, out of range, inconsistent, or a
                                size that does not fit in 64 bits */
  SWIFTKV_ENOMEM = -2,       /* host or device memory, or a configured budget, is exhausted */
  SWIFTKV_ENOTFOUND = -3,    /* the named object (chunk, model, request) does not exist */
  SWIFTKV_EBUSY = -4,        /* the object is in use (pinned, being read, lent) and was left as is */
  SWIFTKV_EIO = -5,          /* a file or disk operation failed, or stored bytes failed their check */
  SWIFTKV_ECUDA = -6,        /* the CUDA runtime or driver reported an error */
  SWIFTKV_ENODEV = -7,       /* the call needs a GPU (or a named GPU) that this process cannot use */
  SWIFTKV_EPEER = -8,        /* a peer process failed, vanished or broke the protocol */
  SWIFTKV_ETIMEDOUT = -9,    /* a wait or a lease ran out of time */
  SWIFTKV_EVERSION = -10,    /* a versioned struct's size or version is not one this library
                                understands, or a peer speaks another protocol version */
  SWIFTKV_EUNSUPPORTED = -11,/* valid, but not supported by this build or this machine */
  SWIFTKV_EUSER = -12,       /* a callback supplied by the caller reported a failure */
  SWIFTKV_ESTATE = -13,      /* the call is not allowed in the object's current state */
  SWIFTKV_EINTERNAL = -14    /* a bug in libswiftkv; the message says where */
} swiftkv_status;

/* Static text naming a status ("SWIFTKV_EINVAL: invalid argument"); never NULL. Unknown values
 * give "unknown swiftkv_status". */
SWIFTKV_API const char *swiftkv_status_string(swiftkv_status status);

/* The message of the calling thread's last failing call: which call, which argument, what was
 * wrong. Thread-local; valid until the next libswiftkv call on this thread, and meaningful only
 * right after a call that returned an error. Never NULL ("" before any failure). */
SWIFTKV_API const char *swiftkv_last_error_message(void);

/* ---------------------------------------------------------------------------------------------
 * Model geometry.
 * ------------------------------------------------------------------------------------------- */
typedef enum swiftkv_dtype {
  SWIFTKV_DTYPE_F16 = 0,      /* IEEE half, 2 bytes */
  SWIFTKV_DTYPE_BF16 = 1,     /* bfloat16, 2 bytes */
  SWIFTKV_DTYPE_F32 = 2,      /* IEEE single, 4 bytes */
  SWIFTKV_DTYPE_FP8_E4M3 = 3, /* 8-bit float, 4 exponent bits, 1 byte */
  SWIFTKV_DTYPE_FP8_E5M2 = 4, /* 8-bit float, 5 exponent bits, 1 byte */
  SWIFTKV_DTYPE_I8 = 5        /* 8-bit integer (quantised KV), 1 byte */
} swiftkv_dtype;

/* The bytes of one element of `dtype`, or 0 for a value that is not a swiftkv_dtype. */
SWIFTKV_API uint32_t swiftkv_dtype_size(swiftkv_dtype dtype);

/* The device value of a model whose KV lives in host memory. */
#define SWIFTKV_DEVICE_HOST (-1)

#define SWIFTKV_MODEL_DESC_VERSION 1

/* The KV geometry of one model. A block is `block_tokens` tokens (the engine's page); a chunk,
 * the unit the library caches, is `chunk_tokens` tokens and a multiple of block_tokens. */
typedef struct swiftkv_model_desc {
  uint32_t size;          /* sizeof(swiftkv_model_desc) as the caller compiled it */
  uint32_t version;       /* SWIFTKV_MODEL_DESC_VERSION as the caller compiled it */
  const char *name;       /* model name, may be NULL for planning calls; not copied by them */
  uint32_t num_layers;    /* decoder layers, L (>= 1) */
  uint32_t num_kv_heads;  /* KV heads, H_kv (>= 1) */
  uint32_t head_dim;      /* dimension per KV head, D (>= 1) */
  uint32_t block_tokens;  /* tokens per block, B (>= 1; default 16) */
  uint32_t chunk_tokens;  /* tokens per chunk, a multiple of block_tokens (default 256) */
  swiftkv_dtype dtype;    /* element type of K and V (default SWIFTKV_DTYPE_F16) */
  int32_t device;         /* CUDA device ordinal, or SWIFTKV_DEVICE_HOST (default) */
} swiftkv_model_desc;

#define SWIFTKV_MODEL_DESC_INIT                                                   \
  {                                                                               \
    (uint32_t)sizeof(swiftkv_model_desc), SWIFTKV_MODEL_DESC_VERSION, NULL, 0, 0, \
        0, 16, 256, SWIFTKV_DTYPE_F16, SWIFTKV_DEVICE_HOST                        \
  }

/* ---------------------------------------------------------------------------------------------
 * Planning: pure functions of the models' geometry (SwiftCache Eq. 1-9 and Algorithm 1). They
 * need no context, touch no memory but their outputs, and are safe from any thread.
 *
 * Every product is checked: a size that does not fit in 64 bits is SWIFTKV_EINVAL with a message
 * naming the argument. A model descriptor is valid when its layers, heads, head_dim, block_tokens
 * and chunk_tokens are non-zero, block_tokens divides chunk_tokens, dtype is a swiftkv_dtype,
 * device >= SWIFTKV_DEVICE_HOST, and the bytes of one full chunk (all layers) fit in 64 bits.
 * ------------------------------------------------------------------------------------------- */

/* KV bytes of one token over all layers: 2 * L * H_kv * D * dtype bytes. */
SWIFTKV_API swiftkv_status swiftkv_geometry_bytes_per_token(const swiftkv_model_desc *m,
                                                            uint64_t *out);

/* The minimum elastic unit between a borrower (the papers' master) and a lender (worker), in
 * blocks of each side (Eq. 6-9): whenever the borrower grows by *borrower_blocks_out blocks, the
 * lender shrinks by *lender_blocks_out blocks, and both are the same number of bytes. The LCM is
 * taken over the per-block byte counts (Eq. 6-7 times the dtype size), which equals Eq. 8-9 when
 * both models use one dtype and keeps the bytes aligned when they do not. */
SWIFTKV_API swiftkv_status swiftkv_geometry_meu(const swiftkv_model_desc *borrower,
                                                const swiftkv_model_desc *lender,
                                                uint64_t *borrower_blocks_out,
                                                uint64_t *lender_blocks_out);

#define SWIFTKV_CAPACITY_PLAN_VERSION 1

/* How a borrower splits its own KV memory (SwiftCache §3.2). Counts are in the borrower's blocks.
 * An output struct: initialise with SWIFTKV_CAPACITY_PLAN_INIT so that the library knows how
 * much of it the caller has. */
typedef struct swiftkv_capacity_plan {
  uint32_t size;
  uint32_t version;
  uint64_t stream_blocks;           /* N_LSC (Eq. 4): single-layer blocks of the layer stream cache */
  uint64_t regular_blocks;          /* N_RC (Eq. 5): full-layer blocks of the regular cache */
  uint64_t max_context_tokens;      /* (N_LSC + N_RC) * B */
  uint64_t baseline_context_tokens; /* floor(C_borrower / (L * M_block)) * B: all layers resident,
                                       nothing borrowed */
  uint64_t lender_full_blocks;      /* sum of K_i (Eq. 2): the borrower's full blocks the lenders
                                       can hold; beyond stream_blocks they are of no use */
} swiftkv_capacity_plan;

#define SWIFTKV_CAPACITY_PLAN_INIT \
  { (uint32_t)sizeof(swiftkv_capacity_plan), SWIFTKV_CAPACITY_PLAN_VERSION, 0, 0, 0, 0, 0 }

/* Plans the borrower's layer stream cache and regular cache from its own KV bytes and the KV
 * bytes each lender offers (Eq. 1-5). lender_kv_bytes may be NULL when n_lenders is 0. */
SWIFTKV_API swiftkv_status swiftkv_plan_borrower(const swiftkv_model_desc *borrower,
                                                 uint64_t borrower_kv_bytes,
                                                 const uint64_t *lender_kv_bytes, size_t n_lenders,
                                                 swiftkv_capacity_plan *out);

/* Algorithm 1 ScaleUp, from the lender's side: a lender that owns `owned_blocks` blocks of
 * `block_tokens` tokens receives a request of `request_tokens` tokens. When it needs more blocks
 * it grows by *lender_delta_out blocks (a multiple of meu_lender) and the borrower gives back
 * *borrower_delta_out blocks (the same multiple of meu_borrower); otherwise both are 0. */
SWIFTKV_API swiftkv_status swiftkv_plan_scale_up(uint64_t owned_blocks, uint32_t block_tokens,
                                                 uint64_t meu_lender, uint64_t meu_borrower,
                                                 uint64_t request_tokens,
                                                 uint64_t *lender_delta_out,
                                                 uint64_t *borrower_delta_out);

/* Algorithm 1 ScaleDown: the longest request in the last window was `max_tokens_in_window`
 * tokens; the lender may release *lender_delta_out blocks (whole MEUs it does not need) and the
 * borrower may take *borrower_delta_out blocks; otherwise both are 0. */
SWIFTKV_API swiftkv_status swiftkv_plan_scale_down(uint64_t owned_blocks, uint32_t block_tokens,
                                                   uint64_t meu_lender, uint64_t meu_borrower,
                                                   uint64_t max_tokens_in_window,
                                                   uint64_t *lender_delta_out,
                                                   uint64_t *borrower_delta_out);

/* ---------------------------------------------------------------------------------------------
 * Devices.
 * ------------------------------------------------------------------------------------------- */

/* The number of CUDA devices this process can use: 0, not an error, when libswiftkv was built
 * without CUDA, when there is no driver, or when there is no device. SWIFTKV_ECUDA when the
 * driver is present but fails. Honours CUDA_VISIBLE_DEVICES. */
SWIFTKV_API swiftkv_status swiftkv_device_count(uint32_t *out);

/* ---------------------------------------------------------------------------------------------
 * Context: one per engine process.
 * ------------------------------------------------------------------------------------------- */
typedef struct swiftkv_ctx swiftkv_ctx;

/* device_mask value: every usable device, possibly none. */
#define SWIFTKV_DEVICE_MASK_ALL UINT64_MAX
/* host_numa_node value: the node local to the context's first device, else no binding. */
#define SWIFTKV_NUMA_NODE_AUTO (-1)

#define SWIFTKV_CTX_CONFIG_VERSION 1

typedef struct swiftkv_ctx_config {
  uint32_t size;              /* sizeof(swiftkv_ctx_config) as the caller compiled it */
  uint32_t version;           /* SWIFTKV_CTX_CONFIG_VERSION as the caller compiled it */
  uint64_t device_mask;       /* bit i: use CUDA device i. Default 0: host only. Naming a device
                                 this process cannot use is SWIFTKV_ENODEV.
                                 SWIFTKV_DEVICE_MASK_ALL: all usable devices, possibly none. */
  uint64_t host_budget_bytes; /* the most host (pinned) memory the context may hold for KV.
                                 Default 0: none. */
  int32_t host_numa_node;     /* NUMA node for host memory, or SWIFTKV_NUMA_NODE_AUTO (default).
                                 A node the machine lacks is SWIFTKV_EINVAL; a build without
                                 libnuma accepts only AUTO and 0 (SWIFTKV_EUNSUPPORTED else). */
  uint32_t reserved0;         /* must be 0 */
  const char *disk_path;      /* directory for the disk tier, or NULL (default: no disk tier). It
                                 must exist and be writable; the context copies the string. */
  uint64_t disk_budget_bytes; /* the most bytes the disk tier may hold; > 0 exactly when
                                 disk_path is set. Default 0. */
} swiftkv_ctx_config;

#define SWIFTKV_CTX_CONFIG_INIT                                                         \
  {                                                                                     \
    (uint32_t)sizeof(swiftkv_ctx_config), SWIFTKV_CTX_CONFIG_VERSION, 0, 0,             \
        SWIFTKV_NUMA_NODE_AUTO, 0, NULL, 0                                              \
  }

/* Creates a context from `config` (NULL: all defaults). On failure *out is left unchanged and
 * nothing is allocated. Thread-safe. */
SWIFTKV_API swiftkv_status swiftkv_ctx_create(swiftkv_ctx **out, const swiftkv_ctx_config *config);

/* Ends a context. Accepts NULL. No other call may use `ctx` during or after this one. */
SWIFTKV_API void swiftkv_ctx_destroy(swiftkv_ctx *ctx);

/* The configuration in effect, with defaults filled in, written into the caller's struct: set
 * out->size and out->version first (SWIFTKV_CTX_CONFIG_INIT); the library writes min(out->size,
 * its own size) bytes. out->disk_path then points into the context and lives as long as it. */
SWIFTKV_API swiftkv_status swiftkv_ctx_get_config(swiftkv_ctx_config *out, const swiftkv_ctx *ctx);

/* The number of CUDA devices the context uses (bits set in its effective device mask). */
SWIFTKV_API swiftkv_status swiftkv_ctx_device_count(uint32_t *out, const swiftkv_ctx *ctx);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* SWIFTKV_SWIFTKV_H */

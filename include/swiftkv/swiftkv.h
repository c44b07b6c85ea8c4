/*
 * swiftkv.h: the public C ABI of libswiftkv, the KV-cache memory layer that lets co-located LLMs
 * lend and borrow KV memory. Pure C11; needs no CUDA header (streams are passed as void*).
 *
 * Conventions (docs/api.md has the full reference):
 *  - Every call returns a swiftkv_status. SWIFTKV_OK and SWIFTKV_IN_PROGRESS are not errors; every
 *    error is negative. After a failing call, swiftkv_last_error_message() says what was wrong with
 *    which argument; outputs are left untouched by every failing call.
 *  - Versioned structs start with `size` and `version`; initialise them with their SWIFTKV_*_INIT
 *    macro or, from a language that cannot expand C macros, with swiftkv_<struct>_init(&s), which
 *    fills the same values from the library itself: the one owner of every default. They only
 *    ever grow at the end: the library reads min(size, sizeof) bytes and fills defaults for
 *    fields a caller built against an older header does not know.
 *  - Opaque handles are made by *_create(&out, ...) and ended by *_destroy, which accepts NULL.
 *  - A context and its regions belong to the process that made them. In a fork() of it every
 *    call on them returns SWIFTKV_ESTATE naming both processes (the child shares the parent's
 *    host slabs, lent memory and disk segments, but none of its threads), and *_destroy releases
 *    nothing: the child's copies go with its exit or exec. A child makes a context of its own.
 */
/* The public header keeps its hand alignment (fields, their comments and the labelled *_INIT
 * macros read as tables): clang-format leaves it alone. */
/* clang-format off */
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

#define SWIFTKV_MODEL_DESC_VERSION 2

/* The KV geometry of one model. A block is `block_tokens` tokens (the engine's page); a chunk,
 * the unit the library caches, is `chunk_tokens` tokens and a multiple of block_tokens.
 *
 * Model identity: the chunk cache keys every chunk by the model's name, its geometry and its
 * `identity`, and stores the same fingerprint in every disk record. The library cannot see the
 * weights, so new weights under an unchanged name, geometry and identity are served the old
 * weights' KV without any error. Put into `identity` whatever changes the K/V a model computes
 * and the name does not say: a weights revision or checksum, a LoRA adapter, a tenant (to keep
 * tenants' prefixes apart), a salt. Two registrations that differ only in it never share a
 * chunk. NULL and "" are the same: no identity (the keys of version 1 callers). */
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
  /* Version 2. */
  const char *identity;   /* weights revision, adapter, tenant or salt: any NUL-terminated
                             bytes that go into every chunk key (see above); NULL (default) or
                             "": none. Copied by swiftkv_model_register. */
} swiftkv_model_desc;

#define SWIFTKV_MODEL_DESC_INIT                       \
  {                                                   \
    /* size */ (uint32_t)sizeof(swiftkv_model_desc),  \
    /* version */ SWIFTKV_MODEL_DESC_VERSION,         \
    /* name */ NULL,                                  \
    /* num_layers */ 0,                               \
    /* num_kv_heads */ 0,                             \
    /* head_dim */ 0,                                 \
    /* block_tokens */ 16,                            \
    /* chunk_tokens */ 256,                           \
    /* dtype */ SWIFTKV_DTYPE_F16,                    \
    /* device */ SWIFTKV_DEVICE_HOST,                 \
    /* identity */ NULL                               \
  }
/* Fills *out with SWIFTKV_MODEL_DESC_INIT (NULL: nothing). */
SWIFTKV_API void swiftkv_model_desc_init(swiftkv_model_desc *out);

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

/* The lending unit between a borrower and a lender: the MEU with the borrower's block replaced
 * by its chunk, so that lent memory holds whole chunks of the borrower (DESIGN.md, Layouts).
 * Whenever a lender lends *lender_blocks_out blocks, the borrower gains *borrower_chunks_out
 * chunks of the same bytes. Elastic regions lend and resize in this unit. */
SWIFTKV_API swiftkv_status swiftkv_geometry_lend_unit(uint64_t *borrower_chunks_out,
                                                      uint64_t *lender_blocks_out,
                                                      const swiftkv_model_desc *borrower,
                                                      const swiftkv_model_desc *lender);

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
/* Fills *out with SWIFTKV_CAPACITY_PLAN_INIT (NULL: nothing). */
SWIFTKV_API void swiftkv_capacity_plan_init(swiftkv_capacity_plan *out);

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

/* A monotonic clock in nanoseconds, for a context or an elastic region that should not read
 * CLOCK_MONOTONIC (tests, simulators). It is called on whatever thread needs the time, possibly
 * with the library's locks held: it must be thread-safe, never go backwards, and never call into
 * libswiftkv. */
typedef uint64_t (*swiftkv_clock_fn)(void *user_data);

/* Which chunk a full tier gives up first. */
typedef enum swiftkv_eviction_policy {
  SWIFTKV_EVICT_LRU = 0,      /* least recently looked up or stored first */
  SWIFTKV_EVICT_RETENTION = 1 /* ascending recompute cost / time since last activity (Pensieve):
                                 idle conversations first, and their leading chunks first */
} swiftkv_eviction_policy;

/* How a borrower reaches the memory of a lender in another process (swiftkv_borrow_remote). */
typedef enum swiftkv_remote_path {
  SWIFTKV_REMOTE_PATH_AUTO = 0, /* a lender on this host (same kernel and network namespace):
                                   its memory is mapped (memfd, VMM or CUDA IPC); any other: UCX */
  SWIFTKV_REMOTE_PATH_UCX = 1,  /* UCX whatever the host (a host whose memory must not be
                                   shared, or to test the cross-node path on one machine) */
  SWIFTKV_REMOTE_PATH_LOCAL = 2 /* mapping only: a lender on another host is refused */
} swiftkv_remote_path;

/* Where the remote tier (memory lent by other hosts) stands in the chunk cache's chain. */
typedef enum swiftkv_tier_order {
  SWIFTKV_TIER_ORDER_REMOTE_FIRST = 0, /* peer -> remote -> host -> disk: another host's GPU
                                          memory ahead of this host's DRAM (a fast network) */
  SWIFTKV_TIER_ORDER_HOST_FIRST = 1    /* peer -> host -> remote -> disk: this host's DRAM first,
                                          remote memory takes its victims (a slow network) */
} swiftkv_tier_order;

/* Version 2 added the chunk cache fields after disk_budget_bytes; version 3 the clock; version 4
 * the coordinator; version 8 lending across nodes; version 9 the tier order. */
#define SWIFTKV_CTX_CONFIG_VERSION 9

typedef struct swiftkv_ctx_config {
  uint32_t size;              /* sizeof(swiftkv_ctx_config) as the caller compiled it */
  uint32_t version;           /* SWIFTKV_CTX_CONFIG_VERSION as the caller compiled it */
  uint64_t device_mask;       /* bit i: use CUDA device i. Default 0: host only. Naming a device
                                 this process cannot use is SWIFTKV_ENODEV.
                                 SWIFTKV_DEVICE_MASK_ALL: all usable devices, possibly none. */
  uint64_t host_budget_bytes; /* the most host (pinned) memory the context may hold for KV.
                                 Default 0: none. More than the process's memory cgroup leaves
                                 is SWIFTKV_ENOMEM (docs/api.md). */
  int32_t host_numa_node;     /* NUMA node for host memory, or SWIFTKV_NUMA_NODE_AUTO (default).
                                 A node the machine lacks is SWIFTKV_EINVAL; a build without
                                 libnuma accepts only AUTO and 0 (SWIFTKV_EUNSUPPORTED else). */
  uint32_t reserved0;         /* must be 0 */
  const char *disk_path;      /* directory for the disk tier, or NULL (default: no disk tier). It
                                 must exist and be writable; the context copies the string. One
                                 context owns it at a time (its .swiftkv.lock): another that
                                 holds it makes create SWIFTKV_EBUSY. */
  uint64_t disk_budget_bytes; /* the most bytes the disk tier may hold; > 0 exactly when
                                 disk_path is set. Default 0. */
  /* Version 2: the chunk cache (see "Chunk cache" below). */
  swiftkv_eviction_policy eviction_policy; /* which chunk a full tier gives up first (default
                                              SWIFTKV_EVICT_RETENTION) */
  uint32_t demote_free_percent;  /* the background thread demotes from the lent and host tiers
                                    while their free space is under this percent of their
                                    capacity (default 25; 0: only when a store finds no room;
                                    at most 100) */
  double recompute_token_cost;   /* retention policy: recompute cost per token that does not
                                    depend on the position (default 1.0; finite, >= 0) */
  double recompute_attention_cost; /* per token, per 1024 tokens of context before it (default
                                      1.0; finite, >= 0); unused with a table */
  const double *attention_cost_table; /* optional profile: entry i is the attention cost per
                                         token at a context of 2^i tokens, non-decreasing,
                                         interpolated linearly between entries (default NULL;
                                         the context copies it) */
  uint32_t attention_cost_entries;    /* entries in the table (0 to 63) */
  uint32_t maintenance_interval_ms;   /* period of the background thread that renews leases,
                                         answers reclaims and demotes ahead (default 10; >= 1),
                                         while the context holds a lease; it sleeps without
                                         one, waking for the disk tier's group commits */
  /* Version 3. */
  swiftkv_clock_fn clock; /* the chunk cache's time (last activity, the retention policy's idle
                             time); NULL (default): CLOCK_MONOTONIC. Elastic regions keep their
                             own clock (swiftkv_elastic_config). */
  void *clock_user_data;  /* passed to clock */
  /* Version 4: the coordinator (see "Coordinator" below). */
  const char *coord_endpoint;  /* ZeroMQ endpoint, "ipc://<path>" or "tcp://<host>:<port>", where
                                  borrowers in other processes reach the regions this context
                                  offers (swiftkv_elastic_offer); bound at creation (SWIFTKV_EPEER
                                  when it cannot be). NULL (default): none. The context copies
                                  the string. An ipc:// socket file is removed when the context
                                  is destroyed (unless another socket took its path since). */
  uint32_t coord_heartbeat_ms; /* how often a borrower renews its remote leases (default 100;
                                  >= 1; at least three times per lease in any case) */
  uint32_t coord_timeout_ms;   /* the longest a handshake or a remote lend waits for its lender
                                  (default 5000; >= 1) */
  /* Version 5: the disk tier's log (see docs/disk-format.md). */
  uint64_t disk_segment_bytes; /* bytes of one segment file of the disk tier: records are
                                  appended to preallocated segments of this size, and the budget
                                  counts whole segments. Default 0: 1 GiB, at most a quarter of
                                  disk_budget_bytes. A given size is capped at half the budget
                                  and rounded down to 64 bytes; one segment stays free for cleaning,
                                  so the disk tier holds records up to the budget less one
                                  segment. A chunk must fit a segment (with 256 bytes of
                                  headers) to be stored on disk. */
  uint32_t disk_sync_ms;       /* group commit: records written to disk are made durable
                                  (fdatasync, then a commit record) within this many ms, by the
                                  background thread, and when the context ends. Default 1000;
                                  0: only when a segment fills and when the context ends. A
                                  process that dies keeps every record it wrote; a machine that
                                  crashes loses at most the records of the last period, and
                                  recovery drops a record cut short whatever the policy. */
  uint32_t transfer_threads;   /* threads of the context's host copy engine (loads and saves of
                                  host pools). Default 0: one less than the machine's cores, at
                                  least 1 and at most 2, so that an engine computing beside the
                                  copies keeps a core; at most 64. */
  /* Version 6. */
  uint32_t max_open_requests;  /* connector requests open at once (begun, not finished):
                                  swiftkv_request_begin beyond is SWIFTKV_EBUSY with nothing
                                  changed. Each open request holds its cached run and the room
                                  reserved for its new chunks until it is finished; all open
                                  requests together reserve at most half of each tier's
                                  capacity (a chunk past that is reserved in the next tier, or
                                  not saved). Default 4096; 1 to 1048576. */
  uint32_t reserved1;          /* must be 0 */
  /* Version 7. */
  uint32_t write_back_on_close; /* with a disk tier: 1 (default) makes swiftkv_ctx_destroy, once
                                   the open requests are finished, move the chunks in host
                                   memory and in lent memory down to disk as far as the disk
                                   tier's free room goes (nothing on disk is evicted for them)
                                   and make the disk tier durable, so that a later context on
                                   the same disk_path finds them. 0: they are dropped. */
  uint32_t reserved2;           /* must be 0 */
  /* Version 8: lending across nodes over UCX (docs/remote.md). */
  const char *coord_ucx_transports; /* the UCX transports for lent memory on another host, as
                                       UCX_TLS names them ("tcp", "rc,cuda_copy", ...). NULL
                                       (default): what UCX picks (UCX_TLS from the environment,
                                       else every transport it finds). The context copies it. */
  swiftkv_remote_path coord_remote_path; /* how this context reaches lent memory in another
                                            process, as a borrower (default
                                            SWIFTKV_REMOTE_PATH_AUTO) */
  uint32_t coord_rma_timeout_ms; /* the longest a batch of UCX reads or writes of lent memory
                                    may go without one of its operations completing (default
                                    2000; >= 1): past it the batch fails, the lender counts as
                                    gone and its leases as lost */
  /* Version 9. */
  swiftkv_tier_order tier_order; /* the chunk cache's chain (default
                                    SWIFTKV_TIER_ORDER_REMOTE_FIRST) */
  uint32_t reserved3;            /* must be 0 */
} swiftkv_ctx_config;

#define SWIFTKV_CTX_CONFIG_INIT                       \
  {                                                   \
    /* size */ (uint32_t)sizeof(swiftkv_ctx_config),  \
    /* version */ SWIFTKV_CTX_CONFIG_VERSION,         \
    /* device_mask */ 0,                              \
    /* host_budget_bytes */ 0,                        \
    /* host_numa_node */ SWIFTKV_NUMA_NODE_AUTO,      \
    /* reserved0 */ 0,                                \
    /* disk_path */ NULL,                             \
    /* disk_budget_bytes */ 0,                        \
    /* eviction_policy */ SWIFTKV_EVICT_RETENTION,    \
    /* demote_free_percent */ 25,                     \
    /* recompute_token_cost */ 1.0,                   \
    /* recompute_attention_cost */ 1.0,               \
    /* attention_cost_table */ NULL,                  \
    /* attention_cost_entries */ 0,                   \
    /* maintenance_interval_ms */ 10,                 \
    /* clock */ NULL,                                 \
    /* clock_user_data */ NULL,                       \
    /* coord_endpoint */ NULL,                        \
    /* coord_heartbeat_ms */ 100,                     \
    /* coord_timeout_ms */ 5000,                      \
    /* disk_segment_bytes */ 0,                       \
    /* disk_sync_ms */ 1000,                          \
    /* transfer_threads */ 0,                         \
    /* max_open_requests */ 4096,                     \
    /* reserved1 */ 0,                                \
    /* write_back_on_close */ 1,                      \
    /* reserved2 */ 0,                                \
    /* coord_ucx_transports */ NULL,                  \
    /* coord_remote_path */ SWIFTKV_REMOTE_PATH_AUTO, \
    /* coord_rma_timeout_ms */ 2000,                  \
    /* tier_order */ SWIFTKV_TIER_ORDER_REMOTE_FIRST, \
    /* reserved3 */ 0                                 \
  }
/* Fills *out with SWIFTKV_CTX_CONFIG_INIT (NULL: nothing). */
SWIFTKV_API void swiftkv_ctx_config_init(swiftkv_ctx_config *out);

/* Creates a context from `config` (NULL: all defaults). On failure *out is left unchanged and
 * nothing is allocated. Thread-safe. */
SWIFTKV_API swiftkv_status swiftkv_ctx_create(swiftkv_ctx **out, const swiftkv_ctx_config *config);

/* Ends a context. Accepts NULL. No other call may use `ctx` during or after this one: a caller
 * whose threads share the context waits for their calls to return first (the Python and Go
 * bindings' close does; Rust's borrows ensure it). Every region made in it must be destroyed
 * first (swiftkv_elastic_destroy). Called
 * from the context's own chunk event callback it would wait for itself: it then does nothing,
 * and says so in swiftkv_last_error_message (ESTATE) and on stderr. In a fork of the process
 * that made the context it releases and writes nothing (ESTATE in swiftkv_last_error_message):
 * what the context holds is the parent's. */
SWIFTKV_API void swiftkv_ctx_destroy(swiftkv_ctx *ctx);

/* The configuration in effect, with defaults filled in, written into the caller's struct: set
 * out->size and out->version first (SWIFTKV_CTX_CONFIG_INIT); the library writes min(out->size,
 * its own size) bytes. out->disk_path then points into the context and lives as long as it. */
SWIFTKV_API swiftkv_status swiftkv_ctx_get_config(swiftkv_ctx_config *out, const swiftkv_ctx *ctx);

/* The number of CUDA devices the context uses (bits set in its effective device mask). */
SWIFTKV_API swiftkv_status swiftkv_ctx_device_count(uint32_t *out, const swiftkv_ctx *ctx);

/* ---------------------------------------------------------------------------------------------
 * Elastic region (the lender's side, SwiftCache §3.4-3.5).
 *
 * A lender keeps its KV cache in an elastic region: block-major memory (n_blocks, L, 2, B, H_kv,
 * D) whose leading `owned` blocks are the lender's and whose tail is lent to one borrower. Both
 * move in lending units (swiftkv_geometry_lend_unit), and a resize moves the boundary, never
 * data: bytes in blocks the lender keeps are untouched by any resize.
 *
 * Memory: lender->device SWIFTKV_DEVICE_HOST puts the region in host memory from a memfd
 * (shareable with another process, bound to the context's NUMA node, page-locked when the
 * context uses a device; it counts against the context's host_budget_bytes), or from one memfd
 * per granule (host_granule_bytes), which passes to a borrower lease by lease as device memory
 * does. A device ordinal
 * puts it on that CUDA device, which the context must use (else SWIFTKV_ENODEV). Memory that is
 * neither owned nor lent is returned to the system (VMM granules unmapped, memfd pages punched
 * out) unless SWIFTKV_ELASTIC_KEEP_COMMITTED is set; a cudaMalloc region is fixed at capacity.
 *
 * Lending is a protocol: lent units are held by a lease that the borrower renews before it
 * expires. When the owned part must grow into lent units, their leases are asked back (see
 * swiftkv_elastic_pending_reclaims) and the lender may use those blocks only once the borrower
 * released the lease or it expired. A borrower never reads a lease after its expiry.
 *
 * An elastic region is thread-safe: every call may come from any thread. It must not outlive its
 * context.
 * ------------------------------------------------------------------------------------------- */
typedef struct swiftkv_elastic swiftkv_elastic;

/* Which memory backs a region. */
typedef enum swiftkv_memory_kind {
  SWIFTKV_MEMORY_HOST_MEMFD = 0, /* host pages of a memfd */
  SWIFTKV_MEMORY_CUDA_VMM = 1,   /* device memory mapped in granules (cuMemCreate/cuMemMap),
                                    shareable as POSIX file descriptors */
  SWIFTKV_MEMORY_CUDA_IPC = 2,   /* one cudaMalloc shared by a CUDA IPC handle; fixed size */
  SWIFTKV_MEMORY_HOST_GRANULES = 3 /* host pages in granules of one memfd each
                                      (swiftkv_elastic_config.host_granule_bytes) */
} swiftkv_memory_kind;

/* How device memory is allocated. */
typedef enum swiftkv_cuda_alloc {
  SWIFTKV_CUDA_ALLOC_AUTO = 0,  /* VMM where the device and driver support it, else cudaMalloc */
  SWIFTKV_CUDA_ALLOC_VMM = 1,   /* VMM or SWIFTKV_EUNSUPPORTED */
  SWIFTKV_CUDA_ALLOC_MALLOC = 2 /* cudaMalloc + IPC handle */
} swiftkv_cuda_alloc;

/* flags: never return free memory to the system (resizes then never map or unmap). */
#define SWIFTKV_ELASTIC_KEEP_COMMITTED (1u << 0)

#define SWIFTKV_ELASTIC_CONFIG_VERSION 3

typedef struct swiftkv_elastic_config {
  uint32_t size;                      /* sizeof(swiftkv_elastic_config) as compiled */
  uint32_t version;                   /* SWIFTKV_ELASTIC_CONFIG_VERSION as compiled */
  const swiftkv_model_desc *lender;   /* the region's geometry and device (required) */
  const swiftkv_model_desc *borrower; /* the model lent to, or NULL: nothing is lent and the
                                         owned part moves in single blocks */
  uint64_t capacity_blocks;           /* the region's blocks, a whole number of lending units */
  uint64_t owned_blocks;              /* blocks owned at creation, a whole number of units */
  uint64_t window_ms;                 /* ScaleDown window t (default 60000) */
  uint64_t lease_ms;                  /* lifetime of a lease between renewals (default 10000) */
  swiftkv_cuda_alloc cuda_alloc;      /* device regions only (default AUTO) */
  uint32_t flags;                     /* SWIFTKV_ELASTIC_* flags (default 0) */
  swiftkv_clock_fn clock;             /* NULL (default): CLOCK_MONOTONIC */
  void *clock_user_data;              /* passed to clock */
  /* Version 2. */
  uint64_t reclaim_deadline_ms;       /* once a lease is asked back, renewals extend it to at
                                         most this long after the asking (what was granted
                                         before stays); then it expires whether or not the
                                         borrower released it (default 30000, > 0) */
  /* Version 3. */
  uint64_t host_granule_bytes;        /* host regions only. 0 (default): one memfd for the whole
                                         region, which a borrower in another process maps whole
                                         at its handshake. Else a multiple of the page size: one
                                         memfd per granule of this many bytes
                                         (SWIFTKV_MEMORY_HOST_GRANULES), committed and returned
                                         granule by granule and passed to a borrower with each
                                         lease, as VMM device memory is: the borrower maps only
                                         the granules of what it holds, never the lender's own
                                         blocks. Each committed granule holds one fd. */
} swiftkv_elastic_config;

#define SWIFTKV_ELASTIC_CONFIG_INIT                       \
  {                                                       \
    /* size */ (uint32_t)sizeof(swiftkv_elastic_config),  \
    /* version */ SWIFTKV_ELASTIC_CONFIG_VERSION,         \
    /* lender */ NULL,                                    \
    /* borrower */ NULL,                                  \
    /* capacity_blocks */ 0,                              \
    /* owned_blocks */ 0,                                 \
    /* window_ms */ 60000,                                \
    /* lease_ms */ 10000,                                 \
    /* cuda_alloc */ SWIFTKV_CUDA_ALLOC_AUTO,             \
    /* flags */ 0,                                        \
    /* clock */ NULL,                                     \
    /* clock_user_data */ NULL,                           \
    /* reclaim_deadline_ms */ 30000,                      \
    /* host_granule_bytes */ 0                            \
  }
/* Fills *out with SWIFTKV_ELASTIC_CONFIG_INIT (NULL: nothing). */
SWIFTKV_API void swiftkv_elastic_config_init(swiftkv_elastic_config *out);

#define SWIFTKV_LAYER_VIEW_VERSION 1

/* One layer of a block-major region seen as an ordinary paged KV cache: page p of the layer
 * starts at (char *)base + p * page_stride; inside a page, K then V, each (B, H_kv, D). Strided
 * kernels (FlashInfer-style page strides, cross-layer pages) use it as is. Only the region's
 * ready blocks are the lender's to touch. An output struct: initialise with its INIT macro. */
typedef struct swiftkv_layer_view {
  uint32_t size;
  uint32_t version;
  void *base;            /* K of token 0, head 0 of block 0 in this layer; a device pointer
                            for device regions */
  uint64_t page_stride;  /* bytes from one block to the next: L * M_block */
  uint64_t k_offset;     /* bytes from a page's start to its K: 0 */
  uint64_t v_offset;     /* bytes from a page's start to its V: B * H_kv * D * dtype bytes */
  uint64_t token_stride; /* H_kv * D * dtype bytes */
  uint64_t head_stride;  /* D * dtype bytes */
  uint64_t num_pages;    /* the region's capacity in blocks */
  int32_t device;        /* CUDA device of base, or SWIFTKV_DEVICE_HOST */
  uint32_t reserved0;
} swiftkv_layer_view;

#define SWIFTKV_LAYER_VIEW_INIT \
  { (uint32_t)sizeof(swiftkv_layer_view), SWIFTKV_LAYER_VIEW_VERSION, NULL, 0, 0, 0, 0, 0, 0, 0, 0 }
/* Fills *out with SWIFTKV_LAYER_VIEW_INIT (NULL: nothing). */
SWIFTKV_API void swiftkv_layer_view_init(swiftkv_layer_view *out);

#define SWIFTKV_LEASE_VERSION 1

/* A lease on lent memory, seen from both sides. The borrower stores chunk c, layer l of its own
 * geometry at byte offset + c * chunk_stride + l * layer_stride of the region: one contiguous
 * piece of layer_stride bytes. An output struct: initialise with SWIFTKV_LEASE_INIT. */
typedef struct swiftkv_lease {
  uint32_t size;
  uint32_t version;
  uint64_t id;                /* never 0, never reused by the region */
  uint64_t first_block;       /* the lender's first block in the lease */
  uint64_t blocks;            /* lender blocks lent */
  uint64_t chunks;            /* the same bytes in borrower chunks */
  uint64_t offset;            /* byte offset of the lease in the region */
  uint64_t bytes;             /* bytes lent */
  void *data;                 /* the lease's first byte in this process (a device pointer for
                                 device regions) */
  uint64_t chunk_stride;      /* bytes of one borrower chunk, all layers */
  uint64_t layer_stride;      /* bytes of one layer of one borrower chunk */
  uint64_t expires_ns;        /* on the region's clock; renew before then */
  uint32_t reclaim_requested; /* 1 when the lender asked for it back */
  uint32_t reserved0;
} swiftkv_lease;

#define SWIFTKV_LEASE_INIT \
  { (uint32_t)sizeof(swiftkv_lease), SWIFTKV_LEASE_VERSION, 0, 0, 0, 0, 0, 0, NULL, 0, 0, 0, 0, 0 }
/* Fills *out with SWIFTKV_LEASE_INIT (NULL: nothing). */
SWIFTKV_API void swiftkv_lease_init(swiftkv_lease *out);

/* lease_id value for swiftkv_elastic_reclaim: every lease. */
#define SWIFTKV_LEASE_ALL UINT64_MAX

#define SWIFTKV_ELASTIC_STATS_VERSION 1

/* owned_blocks + lent_blocks + free_blocks == capacity_blocks at every moment. */
typedef struct swiftkv_elastic_stats {
  uint32_t size;
  uint32_t version;
  uint64_t capacity_blocks;
  uint64_t owned_blocks;        /* Algorithm 1's N_i: ready_blocks plus those being reclaimed */
  uint64_t ready_blocks;        /* the leading blocks the lender may use now */
  uint64_t reclaiming_blocks;   /* owned, but a borrower still holds them */
  uint64_t lent_blocks;         /* held by leases beyond the owned part */
  uint64_t free_blocks;         /* neither owned nor lent */
  uint64_t unit_lender_blocks;  /* the lending unit in lender blocks */
  uint64_t unit_borrower_chunks;/* the lending unit in borrower chunks (0 without a borrower) */
  uint64_t leases;              /* leases held now */
  uint64_t region_bytes;        /* address range of the region */
  uint64_t committed_bytes;     /* physical memory behind it now */
  uint64_t scale_ups;           /* resizes that grew the owned part */
  uint64_t scale_downs;         /* resizes that shrank it */
  uint64_t leases_granted;
  uint64_t leases_expired;
  uint64_t reclaims_requested;  /* leases asked back */
  swiftkv_memory_kind memory_kind;
  int32_t device;               /* CUDA device, or SWIFTKV_DEVICE_HOST */
} swiftkv_elastic_stats;

#define SWIFTKV_ELASTIC_STATS_INIT                                                           \
  {                                                                                          \
    (uint32_t)sizeof(swiftkv_elastic_stats), SWIFTKV_ELASTIC_STATS_VERSION, 0, 0, 0, 0, 0, 0, \
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, SWIFTKV_MEMORY_HOST_MEMFD, 0                           \
  }
/* Fills *out with SWIFTKV_ELASTIC_STATS_INIT (NULL: nothing). */
SWIFTKV_API void swiftkv_elastic_stats_init(swiftkv_elastic_stats *out);

/* Creates a region and commits its owned part. On failure *out is unchanged and nothing is
 * held. EINVAL: a bad config (a count not a whole number of lending units, owned > capacity,
 * zero window or lease); ENOMEM: the host budget or the device cannot hold it; ENODEV: the
 * lender's device is not one of the context's. */
SWIFTKV_API swiftkv_status swiftkv_elastic_create(swiftkv_elastic **out, swiftkv_ctx *ctx,
                                                  const swiftkv_elastic_config *config);

/* Ends a region and every lease on it. Accepts NULL. No other call may use `e` during or after
 * this one; the memory goes back to the system once no importer maps it either. In a fork of
 * the process that made it, it releases nothing (ESTATE in swiftkv_last_error_message). */
SWIFTKV_API void swiftkv_elastic_destroy(swiftkv_elastic *e);

/* The per-layer view of `layer` (< the lender's num_layers). */
SWIFTKV_API swiftkv_status swiftkv_elastic_layer_view(swiftkv_layer_view *out,
                                                      const swiftkv_elastic *e, uint32_t layer);

/* Algorithm 1 ScaleUp for a request of `request_tokens` tokens, applied: the owned part grows by
 * *lender_blocks_out blocks (whole lending units; 0 when it is large enough) and the borrower
 * loses *borrower_chunks_out chunks of lendable memory. The request is remembered for ScaleDown.
 * Returns SWIFTKV_IN_PROGRESS when owned blocks are still held by leases being asked back (the
 * lender may use ready_blocks now, the rest once released), SWIFTKV_OK when all are ready.
 * SWIFTKV_ENOMEM (nothing changed) when capacity_blocks cannot hold the request. */
SWIFTKV_API swiftkv_status swiftkv_elastic_scale_for_request(uint64_t *lender_blocks_out,
                                                             uint64_t *borrower_chunks_out,
                                                             swiftkv_elastic *e,
                                                             uint64_t request_tokens);

/* The periodic step: expires leases, then Algorithm 1 ScaleDown over the longest request of the
 * last window_ms, applied: the owned part shrinks by *lender_blocks_out blocks (the lendable
 * tail grows by *borrower_chunks_out borrower chunks). It never shrinks below `in_use_blocks`,
 * the engine's high-water mark (1 + the highest block holding live KV; EINVAL above capacity).
 * Returns SWIFTKV_IN_PROGRESS while owned blocks are still being reclaimed, else SWIFTKV_OK. */
SWIFTKV_API swiftkv_status swiftkv_elastic_tick(uint64_t *lender_blocks_out,
                                                uint64_t *borrower_chunks_out, swiftkv_elastic *e,
                                                uint64_t in_use_blocks);

/* Expires leases, then sets the owned part to `owned_blocks`, applied: for a lender that decides
 * itself which of its blocks are idle (an engine whose scheduler takes its tail blocks out of use
 * before it lends them, as the vLLM connector does), in place of Algorithm 1's two calls. Growing
 * takes the free units at the owned part's end and asks back the leases on lent ones
 * (SWIFTKV_IN_PROGRESS until they are released or expire; ready_blocks says how far the lender
 * may use it meanwhile, swiftkv_elastic_wait_reclaims waits); shrinking gives the tail's memory
 * up (decommitted: the lender must no longer touch it) and makes it lendable. The owned part
 * grew or shrank by *lender_blocks_out blocks, the lendable memory by as many borrower chunks
 * (*borrower_chunks_out). No request is remembered for ScaleDown. SWIFTKV_EINVAL, nothing
 * changed, for a count that is not a whole number of lending units or is past capacity_blocks;
 * SWIFTKV_ENOMEM, nothing changed, when the growth's memory cannot be committed. */
SWIFTKV_API swiftkv_status swiftkv_elastic_resize(uint64_t *lender_blocks_out,
                                                  uint64_t *borrower_chunks_out, swiftkv_elastic *e,
                                                  uint64_t owned_blocks);

/* Lends up to `max_units` lending units (>= 1) as one lease: the highest free units, which the
 * owned part reaches last. Fewer units when fewer are free in one run; SWIFTKV_ENOMEM when none
 * is free; SWIFTKV_ESTATE when the region has no borrower. */
SWIFTKV_API swiftkv_status swiftkv_elastic_lend(swiftkv_lease *out, swiftkv_elastic *e,
                                                uint64_t max_units);

/* The current state of a held lease (its expiry and reclaim flag change). SWIFTKV_ETIMEDOUT when
 * it expired, SWIFTKV_ENOTFOUND when it is not held. */
SWIFTKV_API swiftkv_status swiftkv_elastic_lease_get(swiftkv_lease *out, const swiftkv_elastic *e,
                                                     uint64_t lease_id);

/* Extends a lease to lease_ms from now. SWIFTKV_ETIMEDOUT when it already expired (its memory is
 * gone), SWIFTKV_ENOTFOUND when it is not held. */
SWIFTKV_API swiftkv_status swiftkv_elastic_renew(swiftkv_elastic *e, uint64_t lease_id);

/* The borrower gives a whole lease back; it must have stopped reading and writing it. Same
 * statuses as renew. */
SWIFTKV_API swiftkv_status swiftkv_elastic_release(swiftkv_elastic *e, uint64_t lease_id);

/* The lender asks a lease (or SWIFTKV_LEASE_ALL) back; the borrower answers by releasing it.
 * A borrower that does not loses it anyway: from the asking on, renewals extend the lease to at
 * most reclaim_deadline_ms later, and then it expires (the borrower's own lease mirror has it
 * stop reading by then, as for any expiry). ENOTFOUND for a lease that is not held. */
SWIFTKV_API swiftkv_status swiftkv_elastic_reclaim(swiftkv_elastic *e, uint64_t lease_id);

/* The ids of leases asked back and not yet released, lowest first: min(count, ids_capacity) are
 * written to ids_out (which may be NULL when ids_capacity is 0) and *count_out is the count. */
SWIFTKV_API swiftkv_status swiftkv_elastic_pending_reclaims(uint64_t *ids_out, size_t ids_capacity,
                                                            size_t *count_out,
                                                            const swiftkv_elastic *e);

/* Blocks the calling thread until no lease is asked back (every lease asked back by a resize or
 * swiftkv_elastic_reclaim has been released by its borrower or has expired), or timeout_ms
 * milliseconds have passed. SWIFTKV_OK when none is asked back (at once when none was),
 * SWIFTKV_ETIMEDOUT when some still are. It waits on a condition signalled by each release, not
 * by polling. The borrower answers on its own thread (a borrower in this process: its context's
 * background thread, woken by the request), so waiting never blocks the answer. */
SWIFTKV_API swiftkv_status swiftkv_elastic_wait_reclaims(swiftkv_elastic *e, uint64_t timeout_ms);

/* Counts and counters of the region, consistent with each other. */
SWIFTKV_API swiftkv_status swiftkv_elastic_stats_get(swiftkv_elastic_stats *out,
                                                     const swiftkv_elastic *e);

/* ---------------------------------------------------------------------------------------------
 * Models. A context knows each model that uses it by a small id. A borrower's chunks are keyed
 * by its fingerprint (name + geometry + dtype), so chunks stored on disk by one context are found
 * again by a later context that registers the same model.
 * ------------------------------------------------------------------------------------------- */
typedef enum swiftkv_role {
  SWIFTKV_ROLE_LENDER = 0,  /* lends elastic memory; has no chunk cache */
  SWIFTKV_ROLE_BORROWER = 1 /* caches conversation prefixes in the tiers */
} swiftkv_role;

/* model value for swiftkv_clear: every model, registered or not. */
#define SWIFTKV_MODEL_ALL UINT32_MAX

#define SWIFTKV_MODEL_CONFIG_VERSION 1

typedef struct swiftkv_model_config {
  uint32_t size;                  /* sizeof(swiftkv_model_config) as compiled */
  uint32_t version;               /* SWIFTKV_MODEL_CONFIG_VERSION as compiled */
  const swiftkv_model_desc *desc; /* geometry; desc->name is required (copied) */
  swiftkv_role role;              /* default SWIFTKV_ROLE_BORROWER */
  uint32_t reserved0;             /* must be 0 */
} swiftkv_model_config;

#define SWIFTKV_MODEL_CONFIG_INIT                       \
  {                                                     \
    /* size */ (uint32_t)sizeof(swiftkv_model_config),  \
    /* version */ SWIFTKV_MODEL_CONFIG_VERSION,         \
    /* desc */ NULL,                                    \
    /* role */ SWIFTKV_ROLE_BORROWER,                   \
    /* reserved0 */ 0                                   \
  }
/* Fills *out with SWIFTKV_MODEL_CONFIG_INIT (NULL: nothing). */
SWIFTKV_API void swiftkv_model_config_init(swiftkv_model_config *out);

/* Registers a model; *model_out is its id in this context (never SWIFTKV_MODEL_ALL, never
 * reused). EINVAL: a bad descriptor or no name; EBUSY: a model with the same name, identity and
 * geometry is registered already. Thread-safe. */
SWIFTKV_API swiftkv_status swiftkv_model_register(uint32_t *model_out, swiftkv_ctx *ctx,
                                                  const swiftkv_model_config *config);

/* Unregisters a model. Its chunks in lent memory move down to host or disk (or are dropped) and
 * its leases are given back; its host and disk chunks stay, for a later registration of the same
 * model. ENOTFOUND for an id that is not registered; ESTATE, with nothing changed, when called
 * from the context's chunk event callback. */
SWIFTKV_API swiftkv_status swiftkv_model_unregister(swiftkv_ctx *ctx, uint32_t model);

/* ---------------------------------------------------------------------------------------------
 * Chunk cache (the borrower's side). Conversation prefixes are cached in whole chunks of the
 * model's chunk_tokens tokens, keyed by XXH3-128 chained over the model fingerprint, the previous
 * chunk's key and the chunk's token ids; a partial last chunk is never cached.
 *
 * Tiers: peer (memory lent by an elastic region on this host and mapped here, see swiftkv_borrow
 * and swiftkv_borrow_remote), remote (memory lent by a context on another host, reached over
 * UCX: swiftkv_borrow_remote, docs/remote.md), host (page-locked DRAM on the context's NUMA node,
 * from host_budget_bytes) and disk (files under disk_path within disk_budget_bytes, each with an
 * XXH3 checksum; found again by the next context). A tier without memory for it is not
 * configured. A new chunk goes to the first configured tier of the chain; a full tier makes room
 * by its eviction policy, moving its victims down the chain, by default
 * peer -> remote -> host -> disk -> dropped (swiftkv_ctx_config.tier_order puts host memory
 * before remote memory). Pinned chunks are never evicted. A background thread demotes
 * ahead of need (demote_free_percent) and lets pending loads out of a tier go first. A chunk that
 * is hit stays where it is: promotion is the caller's choice (swiftkv_move).
 *
 * A moving chunk is readable in exactly one tier at every moment and never lost in between; a
 * chunk that fails its check is dropped, counted in load_failures, and never returned.
 *
 * Chunk bytes, in swiftkv_store and swiftkv_retrieve: block-major per chunk, (L, 2, chunk_tokens,
 * H_kv, D) elements of the model's dtype, chunk after chunk; one layer of one chunk is one
 * contiguous piece of 2 * chunk_tokens * H_kv * D elements (K then V).
 *
 * Token ids are uint32_t. Every call here is thread-safe, and takes the model id from
 * swiftkv_model_register (ENOTFOUND for an id that is not registered; ESTATE for a lender).
 * ------------------------------------------------------------------------------------------- */
typedef enum swiftkv_tier {
  SWIFTKV_TIER_PEER = 0,
  SWIFTKV_TIER_HOST = 1,
  SWIFTKV_TIER_DISK = 2,
  SWIFTKV_TIER_DROPPED = 3, /* not cached: recompute */
  SWIFTKV_TIER_REMOTE = 4   /* memory lent by another host (numbered after DROPPED, which
                               predates it) */
} swiftkv_tier;

/* tier_mask bits for swiftkv_clear. */
#define SWIFTKV_TIER_BIT(tier) (1u << (tier))
#define SWIFTKV_TIERS_ALL 0x17u /* peer, host, disk and remote */

#define SWIFTKV_LOOKUP_RESULT_VERSION 2

/* What a prompt can reuse. A prefix-caching engine loads [0, prefix_tokens) and computes the
 * rest. With leading-end eviction (SWIFTKV_EVICT_RETENTION) a prompt may have a dropped leading
 * range, or a chunk missing between cached ones (its tiers give up chunks each on its own): the
 * engine recomputes tokens [0, dropped_head_tokens) as a request of their own, loads
 * [dropped_head_tokens, dropped_head_tokens + loadable_tokens) and computes the rest. That run is
 * the longest cached one (the earliest of equal ones), so it leaves the fewest tokens to compute;
 * when it is the prefix, dropped_head_tokens is 0 and loadable_tokens is prefix_tokens. An output
 * struct: initialise with SWIFTKV_LOOKUP_RESULT_INIT. */
typedef struct swiftkv_lookup_result {
  uint32_t size;
  uint32_t version;
  uint64_t chunks;              /* full chunks in the tokens */
  uint64_t prefix_tokens;       /* leading tokens that can be loaded from token 0 */
  uint64_t dropped_head_tokens; /* tokens before the longest cached run, cached or not (0 when
                                   that run starts at token 0 or none is cached) */
  uint64_t loadable_tokens;     /* the longest cached run's tokens */
  uint64_t chunks_per_tier[3];  /* cached chunks in each tier (peer, host, disk), in all chunks */
  /* Version 2. */
  uint64_t remote_chunks;       /* cached chunks in the remote tier, in all chunks */
} swiftkv_lookup_result;

#define SWIFTKV_LOOKUP_RESULT_INIT \
  { (uint32_t)sizeof(swiftkv_lookup_result), SWIFTKV_LOOKUP_RESULT_VERSION, 0, 0, 0, 0, {0, 0, 0}, 0 }
/* Fills *out with SWIFTKV_LOOKUP_RESULT_INIT (NULL: nothing). */
SWIFTKV_API void swiftkv_lookup_result_init(swiftkv_lookup_result *out);

/* Where each full chunk of `tokens` (any length; a partial last chunk is ignored) is cached:
 * residency_out[i] (a swiftkv_tier) for the first min(chunks, residency_capacity) chunks;
 * residency_out may be NULL when residency_capacity is 0. Counts as activity of the cached
 * chunks for the eviction policies, and as hits or misses in the stats. */
SWIFTKV_API swiftkv_status swiftkv_lookup(swiftkv_lookup_result *out, uint8_t *residency_out,
                                          size_t residency_capacity, swiftkv_ctx *ctx,
                                          uint32_t model, const uint32_t *tokens,
                                          size_t n_tokens);

/* Stores the chunks of `tokens` (a multiple of chunk_tokens) from host memory `kv`, which holds
 * exactly n_tokens / chunk_tokens chunks (kv_bytes). Chunks already cached are left as they are.
 * A chunk becomes visible to swiftkv_lookup only once it is stored whole. *cached_tokens_out:
 * the leading tokens cached after the call; fewer than n_tokens when some chunk found no room in
 * any tier (pinned chunks fill it, or no tier is configured), which is counted in the stats.
 * A chunk that cannot be written (EIO: a disk error) ends the call with that status; the chunks
 * before it stay cached, whole, and *cached_tokens_out is then still written with the leading
 * tokens cached (for any failure after the arguments were checked; on EINVAL it is untouched). */
SWIFTKV_API swiftkv_status swiftkv_store(uint64_t *cached_tokens_out, swiftkv_ctx *ctx,
                                         uint32_t model, const uint32_t *tokens, size_t n_tokens,
                                         const void *kv, size_t kv_bytes);

/* Copies cached chunks into host memory `kv`: the chunks of `tokens` from token `start_token` (a
 * multiple of chunk_tokens) on, as many as kv_bytes (a multiple of the chunk's bytes) holds, up
 * to the first chunk that is not cached or fails its check. *loaded_tokens_out: tokens copied,
 * counted from start_token. Bytes of kv past them are unspecified. */
SWIFTKV_API swiftkv_status swiftkv_retrieve(uint64_t *loaded_tokens_out, swiftkv_ctx *ctx,
                                            uint32_t model, const uint32_t *tokens,
                                            size_t n_tokens, uint64_t start_token, void *kv,
                                            size_t kv_bytes);

/* Borrows up to max_units lending units of `lender` (an elastic region of this process whose
 * borrower geometry is this model's) into the model's peer tier; *lease_id_out is the region's
 * lease id. The context renews the lease, and when the lender reclaims it moves the chunks there
 * down to host or disk (or drops them) and releases it. ENOMEM: nothing free to lend. */
SWIFTKV_API swiftkv_status swiftkv_borrow(uint64_t *lease_id_out, swiftkv_ctx *ctx,
                                          uint32_t model, swiftkv_elastic *lender,
                                          uint64_t max_units);

/* Controller (LMCache's controller API). `tokens` is a multiple of chunk_tokens and names the
 * chunks of its prefix. */

/* Pins every chunk of `tokens` (pins are counted): a pinned chunk is never evicted or cleared.
 * ENOTFOUND, nothing pinned, when one is not cached. */
SWIFTKV_API swiftkv_status swiftkv_pin(swiftkv_ctx *ctx, uint32_t model, const uint32_t *tokens,
                                       size_t n_tokens);

/* Takes one pin off every chunk of `tokens`. ENOTFOUND, nothing changed, when one is not cached
 * or not pinned. */
SWIFTKV_API swiftkv_status swiftkv_unpin(swiftkv_ctx *ctx, uint32_t model,
                                         const uint32_t *tokens, size_t n_tokens);

/* Drops unpinned chunks in the tiers of tier_mask (SWIFTKV_TIER_BIT values): the chunks of
 * `tokens`, or with tokens NULL and n_tokens 0 every chunk of `model`, or of every model with
 * SWIFTKV_MODEL_ALL. *cleared_chunks_out: chunks dropped. */
SWIFTKV_API swiftkv_status swiftkv_clear(uint64_t *cleared_chunks_out, swiftkv_ctx *ctx,
                                         uint32_t model, uint32_t tier_mask,
                                         const uint32_t *tokens, size_t n_tokens);

/* Moves every chunk of `tokens` to tier `to` (pinned ones too), making room there by the
 * eviction policy. *chunks_there_out: the chunks of `tokens` in `to` afterwards (fewer when
 * `to` could not make room). ENOTFOUND, nothing moved, when a chunk is not cached; EINVAL when
 * `to` is not configured for the model. */
SWIFTKV_API swiftkv_status swiftkv_move(uint64_t *chunks_there_out, swiftkv_ctx *ctx,
                                        uint32_t model, const uint32_t *tokens, size_t n_tokens,
                                        swiftkv_tier to);

/* Chunks named by the caller. An engine that keys its pages itself (vLLM's block hashes, which
 * carry its LoRA adapter, multimodal inputs, cache salt and prompt embeddings; SGLang's page
 * keys) names chunks by those keys instead of handing the library their tokens: `names` holds
 * names_bytes / name_bytes names of name_bytes bytes each (1 to SWIFTKV_MAX_CHUNK_NAME_BYTES),
 * one per chunk, in the order of the sequence. The library chains nothing over names: a name
 * must already stand for its chunk's tokens and everything before them (a chained hash), as
 * the engines' keys do. The model's fingerprint (name, geometry, identity) is still in every
 * key, so a name never finds another model's chunk, and a named chunk never equals a chunk
 * named by tokens. Named chunks live in every tier with the same eviction, compression, leases,
 * checksums and recovery as the others (a disk tier finds them again under the same names).
 * Each call below does what the token call above it does, with chunk counts where that one
 * counts tokens; names_bytes 0 names no chunk. A bad name_bytes or names_bytes is EINVAL with
 * nothing changed. */
#define SWIFTKV_MAX_CHUNK_NAME_BYTES 64

/* swiftkv_lookup of named chunks: the result's token counts are chunks times chunk_tokens,
 * counted from the first name. */
SWIFTKV_API swiftkv_status swiftkv_lookup_named(swiftkv_lookup_result *out, uint8_t *residency_out,
                                                size_t residency_capacity, swiftkv_ctx *ctx,
                                                uint32_t model, const void *names,
                                                size_t names_bytes, uint32_t name_bytes);
/* swiftkv_store of named chunks from `kv` (one chunk's bytes per name): *cached_chunks_out is
 * the leading names cached after the call. first_chunk: the number of the first name's chunk in
 * its sequence (0: the sequence's first chunk), which the retention policy prices it by. */
SWIFTKV_API swiftkv_status swiftkv_store_named(uint64_t *cached_chunks_out, swiftkv_ctx *ctx,
                                               uint32_t model, const void *names,
                                               size_t names_bytes, uint32_t name_bytes,
                                               uint64_t first_chunk, const void *kv,
                                               size_t kv_bytes);
/* swiftkv_retrieve of named chunks from the first name on, as many as kv_bytes holds, up to the
 * first that is not cached or fails its check: *loaded_chunks_out chunks copied. */
SWIFTKV_API swiftkv_status swiftkv_retrieve_named(uint64_t *loaded_chunks_out, swiftkv_ctx *ctx,
                                                  uint32_t model, const void *names,
                                                  size_t names_bytes, uint32_t name_bytes,
                                                  void *kv, size_t kv_bytes);
SWIFTKV_API swiftkv_status swiftkv_pin_named(swiftkv_ctx *ctx, uint32_t model, const void *names,
                                             size_t names_bytes, uint32_t name_bytes);
SWIFTKV_API swiftkv_status swiftkv_unpin_named(swiftkv_ctx *ctx, uint32_t model,
                                               const void *names, size_t names_bytes,
                                               uint32_t name_bytes);
/* swiftkv_clear of the named chunks (names_bytes 0: none; swiftkv_clear drops a whole model). */
SWIFTKV_API swiftkv_status swiftkv_clear_named(uint64_t *cleared_chunks_out, swiftkv_ctx *ctx,
                                               uint32_t model, uint32_t tier_mask,
                                               const void *names, size_t names_bytes,
                                               uint32_t name_bytes);
SWIFTKV_API swiftkv_status swiftkv_move_named(uint64_t *chunks_there_out, swiftkv_ctx *ctx,
                                              uint32_t model, const void *names,
                                              size_t names_bytes, uint32_t name_bytes,
                                              swiftkv_tier to);
/* The keys the library gives the named chunks: keys_out[2i] and keys_out[2i+1] are the key_lo and
 * key_hi that swiftkv_chunk_event reports for the chunk of name i, for the first
 * min(names, keys_capacity / 2) names (an engine publishing cache events maps the library's
 * events back to its own names with them). Computes only: nothing is looked up or touched. */
SWIFTKV_API swiftkv_status swiftkv_chunk_keys_named(uint64_t *keys_out, size_t keys_capacity,
                                                    const swiftkv_ctx *ctx, uint32_t model,
                                                    const void *names, size_t names_bytes,
                                                    uint32_t name_bytes);

/* ---------------------------------------------------------------------------------------------
 * Compression (docs/codecs.md: the frame formats, each codec's error bound, the rules). Chunks
 * below the GPU (host memory and disk) may be stored encoded: lossless (zstd, on builds with
 * libzstd) or lossy (KIVI-style quantisation, FP8 E4M3). The budgets count the bytes stored.
 * Lent memory (the peer tier) holds decoded chunks only: a chunk moved there is decoded. Loads
 * (the connector) and swiftkv_retrieve always return decoded bytes (a device pool's loads move
 * kivi and fp8 chunks compressed and decode them on its GPU, into the pages, bit for bit as the
 * CPU decodes them); a lossy chunk is returned
 * only to a model that accepts lossy chunks (swiftkv_compression_config), and otherwise ends
 * the cached run as a chunk that is not cached would (counted in lossy_refused). A chunk once
 * lossy stays lossy (its exact bytes are gone), and is never encoded a second time by a move.
 * ------------------------------------------------------------------------------------------- */
typedef enum swiftkv_codec {
  SWIFTKV_CODEC_RAW = 0,  /* the chunk's bytes as they are */
  SWIFTKV_CODEC_ZSTD = 1, /* lossless; SWIFTKV_EUNSUPPORTED in a build without libzstd */
  SWIFTKV_CODEC_KIVI = 2, /* lossy: keys per channel, values per token, 8, 4 or 2 bits */
  SWIFTKV_CODEC_FP8 = 3   /* lossy: FP8 E4M3 with a float scale per token */
} swiftkv_codec;

#define SWIFTKV_CODEC_PARAMS_VERSION 1

/* An encoding. The fields a codec does not use must be 0 (zstd_level: any). Codecs take chunks
 * of f16 or bf16 elements only (EINVAL for other dtypes, except SWIFTKV_CODEC_RAW). */
typedef struct swiftkv_codec_params {
  uint32_t size;         /* sizeof(swiftkv_codec_params) as the caller compiled it */
  uint32_t version;      /* SWIFTKV_CODEC_PARAMS_VERSION */
  swiftkv_codec codec;   /* default SWIFTKV_CODEC_RAW */
  uint32_t bits;         /* kivi: 8, 4 or 2 */
  uint32_t group;        /* kivi: tokens (keys) or channels (values) per scale, a power of two
                            in 8..256 */
  uint32_t byte_planes;  /* zstd: 1 splits 16-bit elements into byte planes before compressing */
  int32_t zstd_level;    /* zstd: the encoder's level, 1..19 (default 1; not part of the format) */
  uint32_t reserved0;    /* must be 0 */
} swiftkv_codec_params;

#define SWIFTKV_CODEC_PARAMS_INIT                                                           \
  {                                                                                       \
    (uint32_t)sizeof(swiftkv_codec_params), SWIFTKV_CODEC_PARAMS_VERSION, SWIFTKV_CODEC_RAW, \
        0, 0, 0, 1, 0                                                                     \
  }
/* Fills *out with SWIFTKV_CODEC_PARAMS_INIT (NULL: nothing). */
SWIFTKV_API void swiftkv_codec_params_init(swiftkv_codec_params *out);

#define SWIFTKV_COMPRESSION_CONFIG_VERSION 1
#define SWIFTKV_MAX_COMPRESSION_METHODS 8

/* A method adaptive mode may choose, with the engine's own quality for it (its profile: AdaptCache
 * measures quality per method and rate on real questions). */
typedef struct swiftkv_compression_method {
  swiftkv_codec_params params; /* not SWIFTKV_CODEC_RAW: the chunk as it is is always an option */
  double quality;              /* in [0, 1] (1: exact); negative (the default): the library
                                  measures it, as 1 - the relative RMS error of the decoded bytes
                                  on the first chunk of the model it sees */
  double decode_gbps;          /* GB/s of decoded bytes its decoder makes; 0 (the default): the
                                  library measures its CPU decoder on that chunk */
} swiftkv_compression_method;

#define SWIFTKV_COMPRESSION_METHOD_INIT { SWIFTKV_CODEC_PARAMS_INIT, -1.0, 0.0 }
/* Fills *out with SWIFTKV_COMPRESSION_METHOD_INIT (NULL: nothing). */
SWIFTKV_API void swiftkv_compression_method_init(swiftkv_compression_method *out);

/* What a model asks of compression, in one of two modes.
 * Fixed mode (adaptive 0): exact chunks entering host memory or the disk (a store, a save, a
 * demotion, a move) are encoded as `host` or `disk` says; raw (the default) leaves them as they
 * come.
 * Adaptive mode (adaptive 1; host and disk must be raw): AdaptCache's policy chooses each exact
 * chunk's encoding as it enters host memory or the disk, among the chunk as it is and `methods`,
 * by the utility
 *     reuse x (alpha x quality - stored bytes / bandwidth of the tier - decode time)
 *       - price x stored bytes
 * where reuse is the chunk's expected reuses from its own history and price is what the
 * tier's last victims lost per byte while it is full (0 while it has room): chunks are kept
 * exact while there is room and compressed further as the fast tiers fill (docs/codecs.md). */
typedef struct swiftkv_compression_config {
  uint32_t size;              /* sizeof(swiftkv_compression_config) as the caller compiled it */
  uint32_t version;           /* SWIFTKV_COMPRESSION_CONFIG_VERSION */
  uint32_t accept_lossy;      /* 1: loads and swiftkv_retrieve may return lossy chunks, decoded;
                                 0 (default): exact bytes only */
  uint32_t adaptive;          /* 1: adaptive mode; 0 (default): fixed mode */
  swiftkv_codec_params host;  /* fixed mode: the encoding of exact chunks in host memory */
  swiftkv_codec_params disk;  /* fixed mode: the encoding of exact chunks on disk */
  double alpha;               /* adaptive: seconds of load time that one reuse's full quality is
                                 worth (default 1) */
  double reuse_horizon_s;     /* adaptive: a chunk idle this long counts half as likely to be
                                 reused (default 60) */
  double host_gbps;           /* adaptive: GB/s from host memory to the GPU (default 25) */
  double disk_gbps;           /* adaptive: GB/s from the disk tier to the GPU (default 3) */
  double recompute_gbps;      /* adaptive: GB/s of KV a recompute makes: a dropped chunk's cost
                                 (default 1.5) */
  uint32_t n_methods;         /* adaptive: methods[0..n_methods); 0: the default set (zstd over
                                 byte planes where built; with accept_lossy also KIVI 8-bit and
                                 4-bit, group 32, and FP8; each where the model's chunks take it) */
  uint32_t reserved0;         /* must be 0 */
  swiftkv_compression_method methods[SWIFTKV_MAX_COMPRESSION_METHODS];
} swiftkv_compression_config;

#define SWIFTKV_COMPRESSION_CONFIG_INIT                                                      \
  {                                                                                        \
    (uint32_t)sizeof(swiftkv_compression_config), SWIFTKV_COMPRESSION_CONFIG_VERSION, 0, 0, \
        SWIFTKV_CODEC_PARAMS_INIT, SWIFTKV_CODEC_PARAMS_INIT, 1.0, 60.0, 25.0, 3.0, 1.5, 0, 0, { \
      SWIFTKV_COMPRESSION_METHOD_INIT, SWIFTKV_COMPRESSION_METHOD_INIT,                     \
          SWIFTKV_COMPRESSION_METHOD_INIT, SWIFTKV_COMPRESSION_METHOD_INIT,                 \
          SWIFTKV_COMPRESSION_METHOD_INIT, SWIFTKV_COMPRESSION_METHOD_INIT,                 \
          SWIFTKV_COMPRESSION_METHOD_INIT, SWIFTKV_COMPRESSION_METHOD_INIT                  \
    }                                                                                      \
  }
/* Fills *out with SWIFTKV_COMPRESSION_CONFIG_INIT (NULL: nothing). */
SWIFTKV_API void swiftkv_compression_config_init(swiftkv_compression_config *out);

/* Sets what `model` asks of compression, from now on (chunks already stored stay as they are;
 * swiftkv_compress re-encodes them). A model registers with SWIFTKV_COMPRESSION_CONFIG_INIT.
 * EINVAL (nothing changed) for a codec the model's chunks do not take, or a lossy host or disk
 * codec without accept_lossy (its chunks could never load); in adaptive mode also for
 * a host or disk codec beside it, a raw, repeated or (without accept_lossy) lossy method, more
 * than SWIFTKV_MAX_COMPRESSION_METHODS, a quality above 1, or an alpha, horizon or bandwidth
 * that is not finite and positive (alpha may be 0). EUNSUPPORTED for zstd in a build without
 * it. */
SWIFTKV_API swiftkv_status swiftkv_compression_set(swiftkv_ctx *ctx, uint32_t model,
                                                   const swiftkv_compression_config *config);

/* LMCache's controller `compress`: re-encodes every chunk of `tokens` (a multiple of
 * chunk_tokens) under `params` in the tier where it is (SWIFTKV_CODEC_RAW decodes); with
 * `params` NULL, under what the model's adaptive policy chooses for it there (EINVAL for a model
 * in fixed mode). A chunk in lent memory stays as it is, as does one its tier has no room for
 * re-encoded (the tier makes room by its eviction policy first). Re-encoding a lossy chunk
 * starts from its approximation; the policy never re-encodes one. *chunks_out: the chunks of
 * `tokens` stored under `params` (or the policy's choice) afterwards. ENOTFOUND, nothing
 * changed, when a chunk is not cached; EINVAL, nothing changed, for parameters the model's
 * chunks do not take, or a lossy codec for a model without accept_lossy. */
SWIFTKV_API swiftkv_status swiftkv_compress(uint64_t *chunks_out, swiftkv_ctx *ctx, uint32_t model,
                                            const uint32_t *tokens, size_t n_tokens,
                                            const swiftkv_codec_params *params);

/* One cached chunk, as swiftkv_chunk_info_get sees it. */
typedef struct swiftkv_chunk_info {
  uint8_t tier;          /* a swiftkv_tier; SWIFTKV_TIER_DROPPED when not cached */
  uint8_t codec;         /* a swiftkv_codec */
  uint8_t bits;          /* kivi's bits, else 0 */
  uint8_t lossy;         /* 1: its bytes decode to an approximation of the chunk */
  uint16_t group;        /* kivi's group, else 0 */
  uint8_t byte_planes;   /* zstd over byte planes */
  uint8_t reserved0;
  uint64_t stored_bytes; /* bytes its tier holds (0 when not cached) */
} swiftkv_chunk_info;

/* Where and how each full chunk of `tokens` is cached: info_out[i] for the first
 * min(chunks, info_capacity) chunks (info_out may be NULL when info_capacity is 0), and
 * *chunks_out the number of full chunks. Records no activity and counts no hit or miss. */
SWIFTKV_API swiftkv_status swiftkv_chunk_info_get(swiftkv_chunk_info *info_out,
                                                  size_t info_capacity, size_t *chunks_out,
                                                  const swiftkv_ctx *ctx, uint32_t model,
                                                  const uint32_t *tokens, size_t n_tokens);
/* swiftkv_chunk_info_get of chunks named by the caller (see "Chunks named by the caller"): one
 * info per name; *chunks_out the number of names. Records no activity, counts no hit or miss. */
SWIFTKV_API swiftkv_status swiftkv_chunk_info_get_named(swiftkv_chunk_info *info_out,
                                                        size_t info_capacity, size_t *chunks_out,
                                                        const swiftkv_ctx *ctx, uint32_t model,
                                                        const void *names, size_t names_bytes,
                                                        uint32_t name_bytes);

#define SWIFTKV_CODEC_STATS_VERSION 1

/* The cached chunks by codec (rows: swiftkv_codec) and tier (columns: swiftkv_tier peer, host,
 * disk), with the bytes they decode to beside the bytes stored: stored_bytes[c][t] /
 * raw_bytes[c][t] is codec c's ratio in tier t. The remote tier, lent memory like the peer tier,
 * holds raw chunks only: swiftkv_stats.remote_chunks and remote_bytes count them. */
typedef struct swiftkv_codec_stats {
  uint32_t size;
  uint32_t version;
  uint64_t chunks[4][3];
  uint64_t raw_bytes[4][3];
  uint64_t stored_bytes[4][3];
  uint64_t encodes;       /* chunks encoded (stores, saves, moves, swiftkv_compress) */
  uint64_t decodes;       /* encoded chunks decoded (loads, retrieves, moves; a device
                             pool's loads decode kivi and fp8 chunks on its GPU) */
  uint64_t lossy_refused; /* lossy chunks a load or retrieve stopped at (exact bytes asked) */
} swiftkv_codec_stats;

#define SWIFTKV_CODEC_STATS_INIT \
  { (uint32_t)sizeof(swiftkv_codec_stats), SWIFTKV_CODEC_STATS_VERSION, {{0}}, {{0}}, {{0}}, 0, 0, 0 }
/* Fills *out with SWIFTKV_CODEC_STATS_INIT (NULL: nothing). */
SWIFTKV_API void swiftkv_codec_stats_init(swiftkv_codec_stats *out);

SWIFTKV_API swiftkv_status swiftkv_codec_stats_get(swiftkv_codec_stats *out,
                                                   const swiftkv_ctx *ctx);

#define SWIFTKV_STATS_VERSION 5

/* The chunk cache's counts (now) and counters (since the context began). Arrays are indexed by
 * swiftkv_tier: peer, host, disk; the remote tier's (version 4) are fields of their own. */
typedef struct swiftkv_stats {
  uint32_t size;
  uint32_t version;
  uint64_t chunks[3];
  uint64_t bytes[3];
  uint64_t capacity_bytes[3];   /* lent memory held, host budget, disk budget */
  uint64_t hits[3];             /* chunks swiftkv_lookup found in each tier */
  uint64_t misses;              /* chunks swiftkv_lookup did not find */
  uint64_t stores;              /* chunks stored */
  uint64_t stores_rejected;     /* chunks no tier had room for */
  uint64_t evictions;           /* chunks dropped by the eviction policy */
  uint64_t demotions;           /* chunks moved down a tier */
  uint64_t promotions;          /* chunks moved up a tier by swiftkv_move */
  uint64_t load_failures;       /* chunks that failed their check or could not be read */
  uint64_t revocations;         /* chunks that left lent memory because the lender took it */
  uint64_t corrupt_files_removed; /* disk records dropped at start-up: torn, failing a check, an
                                     older copy of a chunk, or over the budget */
  uint64_t demotions_deferred;  /* background demotions that let a pending load go first */
  /* Version 2: the disk tier's log. */
  uint64_t disk_files_skipped;      /* entries of disk_path left alone at start-up: not segment
                                       files, not regular files (FIFO, socket, directory,
                                       symlink), unreadable, torn, or of another format */
  uint64_t disk_records_mismatched; /* disk reads that found another record than the chunk (the
                                       file was overwritten or moved): each a miss */
  uint64_t disk_segments_cleaned;   /* segments emptied by moving their live records, for reuse */
  uint64_t disk_bytes_relocated;    /* record bytes those moves copied */
  uint64_t disk_bytes_allocated;    /* bytes of segment files on disk: what disk_budget_bytes
                                       bounds */
  /* Version 3: memory beside the budgets. */
  uint64_t index_bytes;           /* host memory of the chunk index (tables and eviction order;
                                     about 170 bytes per chunk it is sized for, see
                                     docs/api.md): not part of host_budget_bytes */
  uint64_t index_capacity_chunks; /* resident chunks the index holds before it grows */
  uint64_t requests_open;         /* connector requests begun and not finished */
  /* Version 4: the remote tier (memory lent by other hosts). */
  uint64_t remote_chunks;
  uint64_t remote_bytes;
  uint64_t remote_capacity_bytes; /* remote lent memory held */
  uint64_t remote_hits;           /* chunks swiftkv_lookup found in the remote tier */
  /* Version 5: a full disk. */
  uint64_t disk_full_refusals; /* segments the filesystem could not give (no space, quota): each
                                  shrinks the disk tier to the segments it holds, which it keeps
                                  filling; it asks for more again after 30 s (docs/disk-format.md) */
} swiftkv_stats;

#define SWIFTKV_STATS_INIT                                                                  \
  {                                                                                         \
    (uint32_t)sizeof(swiftkv_stats), SWIFTKV_STATS_VERSION, {0, 0, 0}, {0, 0, 0}, {0, 0, 0}, \
        {0, 0, 0}, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0      \
  }
/* Fills *out with SWIFTKV_STATS_INIT (NULL: nothing). */
SWIFTKV_API void swiftkv_stats_init(swiftkv_stats *out);

SWIFTKV_API swiftkv_status swiftkv_stats_get(swiftkv_stats *out, const swiftkv_ctx *ctx);

/* The context's counters (swiftkv_stats and swiftkv_coord_stats) in Prometheus' text exposition
 * format 0.0.4, each with its HELP and TYPE lines; per-tier families carry a label
 * tier="peer|host|disk|remote". The names and units are listed in docs/api.md (counters end in _total,
 * sizes are bytes, times seconds). *length_out is the text's length without its NUL; when
 * capacity > that length the text and a NUL are written to buf, else nothing is written (call
 * again with a larger buffer). buf may be NULL when capacity is 0. Thread-safe. */
SWIFTKV_API swiftkv_status swiftkv_metrics_text(char *buf, size_t capacity, size_t *length_out,
                                                const swiftkv_ctx *ctx);

/* Why a chunk left a tier without the caller asking. */
typedef enum swiftkv_chunk_event_reason {
  SWIFTKV_CHUNK_EVICTED = 0, /* its tier needed room */
  SWIFTKV_CHUNK_REVOKED = 1, /* its lender took the memory back */
  SWIFTKV_CHUNK_CORRUPT = 2  /* its bytes failed their check or could not be read */
} swiftkv_chunk_event_reason;

typedef struct swiftkv_chunk_event {
  uint32_t model;     /* the model's id, or SWIFTKV_MODEL_ALL when it is not registered */
  swiftkv_tier from;
  swiftkv_tier to;    /* SWIFTKV_TIER_DROPPED when the chunk is gone */
  swiftkv_chunk_event_reason reason;
  uint64_t key_lo;    /* the chunk's key */
  uint64_t key_hi;
} swiftkv_chunk_event;

/* Called after a chunk was demoted or dropped by the cache, on the thread that moved it (a
 * caller's thread inside swiftkv_store or swiftkv_move, or the context's background thread), with
 * no lock of the library held. It may call libswiftkv, swiftkv_set_chunk_event_callback and calls
 * that move chunks (and so call it again, on the same thread) included. Only
 * swiftkv_model_unregister (ESTATE) and swiftkv_ctx_destroy (ignored, see there) are refused
 * on the context whose callback this is: both would wait for the callback's own thread. */
typedef void (*swiftkv_chunk_event_fn)(const swiftkv_chunk_event *event, void *user_data);

/* Sets (fn NULL: removes) the context's chunk event callback. Once this returns, the previous
 * callback is not called again and no other thread is still running it (a call made from inside
 * that callback does not wait for its own thread's run, which goes on to its end). */
SWIFTKV_API swiftkv_status swiftkv_set_chunk_event_callback(swiftkv_ctx *ctx,
                                                            swiftkv_chunk_event_fn fn,
                                                            void *user_data);

/* ---------------------------------------------------------------------------------------------
 * Coordinator: lending and borrowing between processes (SwiftCache §3.5), over ZeroMQ.
 *
 * A lender's context binds coord_endpoint and offers elastic regions under names; a borrower's
 * context borrows from one by endpoint and name. The handshake checks that the region lends to
 * a borrower of the model's chunk geometry and that both sides compute the same lending unit;
 * the lender then passes its memory (a memfd over a Unix socket, or a CUDA IPC handle) and the
 * borrower maps it once; memory passed per lease (VMM device memory, host granules) comes with
 * each grant, and the borrower maps only the granules of the leases it holds. That needs both processes on one host (the fds cross a
 * Unix socket; a CUDA export needs the same GPUs). A lender on another host (another kernel or
 * network namespace), or any lender when coord_remote_path is SWIFTKV_REMOTE_PATH_UCX, is reached
 * over UCX instead: each grant carries the remote key of the lease's registered bytes, which the
 * borrower reads and writes with one-sided UCX operations (docs/remote.md).
 *
 * The lease rules are those of swiftkv_borrow, across processes: the borrower's context renews
 * its leases by heartbeat (coord_heartbeat_ms) and never reads a lease past the time its last
 * renewal could have covered; when the lender's region must grow into a lease it asks it back,
 * and the borrower moves the chunks there down to host or disk (or drops them, counted), waits
 * for reads in flight, and gives it back (the ack), and only then does the lender use it. A
 * lender process that dies makes its leases lost at once: the chunks there are dropped and
 * loads from them report failed tokens (see swiftkv_wait_layer_load), never wrong bytes. A
 * borrower process that dies costs the lender its leases' remaining time.
 *
 * Messages carry a protocol version and sequence numbers and are checked field by field; a
 * malformed, unexpected, duplicated or reordered message is logged to stderr (SWIFTKV_LOG=off
 * silences it), counted in swiftkv_coord_stats.messages_dropped, and changes nothing.
 *
 * A context has one coordinator thread. A build without ZeroMQ answers SWIFTKV_EUNSUPPORTED.
 * ------------------------------------------------------------------------------------------- */

/* Offers `e` to borrowers in other processes under `name` (1 to 255 bytes), through its
 * context's coord_endpoint, until the region is destroyed. ESTATE: the context has no endpoint
 * or the region no borrower geometry; EBUSY: the name is taken, or the region offered already. */
SWIFTKV_API swiftkv_status swiftkv_elastic_offer(swiftkv_elastic *e, const char *name);

/* Borrows up to max_units lending units from the region offered as `lender_name` at `endpoint`
 * (in another process, or this one) into the peer tier of `model`, as swiftkv_borrow does (the
 * remote tier when the lender is reached over UCX); the first call per endpoint and name makes
 * the handshake, later ones reuse it. *lease_id_out: the
 * lender's lease id. EINVAL: a malformed endpoint, or a region lending to another geometry;
 * ENOTFOUND: nothing offered under that name; ENOMEM: nothing free to lend, or this context
 * holds 1024 leases of that lender already (ask for more units per lease); EPEER: nothing
 * listens at the endpoint (the connection is refused or dropped during the handshake: the lender
 * is gone or not started; returned at once), or the lender broke the protocol or went away;
 * ETIMEDOUT: something accepted the connection but gave no answer within coord_timeout_ms;
 * EUNSUPPORTED: the lender is on another host and one side has no UCX (or the region is device
 * memory and the lender's UCX has no CUDA), or this context's coord_remote_path is LOCAL. */
SWIFTKV_API swiftkv_status swiftkv_borrow_remote(uint64_t *lease_id_out, swiftkv_ctx *ctx,
                                                 uint32_t model, const char *endpoint,
                                                 const char *lender_name, uint64_t max_units);

/* Version 2 added the counters of lending across nodes (from remote_sessions on). */
#define SWIFTKV_COORD_STATS_VERSION 2

/* The coordinator's counts (now) and counters (since the context began). */
typedef struct swiftkv_coord_stats {
  uint32_t size;
  uint32_t version;
  uint64_t offered_regions;     /* regions this context offers */
  uint64_t sessions_served;     /* borrower sessions on them */
  uint64_t lenders_connected;   /* remote lenders this context borrows from */
  uint64_t messages_sent;
  uint64_t messages_received;
  uint64_t messages_dropped;    /* malformed, unexpected, duplicated or reordered */
  uint64_t heartbeats_sent;
  uint64_t heartbeats_answered;
  uint64_t reclaims_sent;       /* leases asked back from remote borrowers */
  uint64_t reclaims_acked;      /* ... and given back */
  uint64_t reclaim_ns_total;    /* request to ack, summed over reclaims_acked */
  uint64_t reclaim_ns_max;
  uint64_t leases_lost;         /* borrowed leases lost to expiry or a dead lender */
  uint64_t lenders_lost;        /* lenders that went away */
  /* Version 2: lending across nodes over UCX. */
  uint64_t remote_sessions;     /* sessions on this context's regions reached over UCX, now */
  uint64_t remote_lenders;      /* lenders this context reaches over UCX, now */
  uint64_t grants_refused;      /* grants this side could not use (a range outside the region, a
                                   remote key UCX refuses), given straight back */
  uint64_t rma_batches;         /* batches of UCX reads and writes of lent memory */
  uint64_t rma_batches_failed;  /* ... that failed (the lender died, stopped answering or refused
                                   an operation): none of their bytes were used */
  uint64_t rma_bytes_read;      /* lent bytes read over UCX */
  uint64_t rma_bytes_written;   /* lent bytes written over UCX */
} swiftkv_coord_stats;

#define SWIFTKV_COORD_STATS_INIT                                                          \
  {                                                                                       \
    (uint32_t)sizeof(swiftkv_coord_stats), SWIFTKV_COORD_STATS_VERSION, 0, 0, 0, 0, 0, 0, 0, \
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0                                          \
  }
/* Fills *out with SWIFTKV_COORD_STATS_INIT (NULL: nothing). */
SWIFTKV_API void swiftkv_coord_stats_init(swiftkv_coord_stats *out);

SWIFTKV_API swiftkv_status swiftkv_coord_stats_get(swiftkv_coord_stats *out,
                                                   const swiftkv_ctx *ctx);

/* ---------------------------------------------------------------------------------------------
 * Engine page pools (the borrower's own KV pages).
 *
 * A pool is a borrower's per-layer paged KV tensors as the library reads and writes them.
 * Element (page p, K or V c, token t, head h, dim d) of layer l is at
 *   layer_base[l] + (p*page_stride + c*kv_stride + t*token_stride + h*head_stride + d) * dtype
 * bytes: strides in elements, as a tensor library reports them, dim stride 1, block_tokens
 * tokens per page. That covers vLLM's [2, pages, B, H, D], FlashInfer's NHD [pages, 2, B, H, D]
 * and HND [pages, 2, H, B, D], and cross-layer pages [pages, L, 2, B, H, D] (one base per
 * layer, page_stride over all layers). Pages [stream_first, stream_first + stream_pages) are
 * stream pages: their memory is shared by all layers (the layer stream cache), which orders
 * loads into them after saves out of them (see the connector).
 * ------------------------------------------------------------------------------------------- */

#define SWIFTKV_POOL_DESC_VERSION 1

typedef struct swiftkv_pool_desc {
  uint32_t size;              /* sizeof(swiftkv_pool_desc) as the caller compiled it */
  uint32_t version;           /* SWIFTKV_POOL_DESC_VERSION */
  uint32_t num_pages;         /* pages in every layer's tensor (>= 1) */
  uint32_t stream_first;      /* the first stream page */
  uint32_t stream_pages;      /* how many stream pages (0: none) */
  uint32_t reserved0;         /* must be 0 */
  void *const *layer_base;    /* num_layers pointers: element (0, K, 0, 0, 0) of each layer;
                                 aligned to the dtype and distinct */
  uint64_t layer_span_bytes;  /* bytes of each layer's tensor from its base: every element
                                 the strides reach must lie inside */
  int64_t page_stride;        /* elements, all > 0, and no two elements of a layer may */
  int64_t kv_stride;          /* share an address */
  int64_t token_stride;
  int64_t head_stride;
} swiftkv_pool_desc;

#define SWIFTKV_POOL_DESC_INIT                       \
  {                                                  \
    /* size */ (uint32_t)sizeof(swiftkv_pool_desc),  \
    /* version */ SWIFTKV_POOL_DESC_VERSION,         \
    /* num_pages */ 0,                               \
    /* stream_first */ 0,                            \
    /* stream_pages */ 0,                            \
    /* reserved0 */ 0,                               \
    /* layer_base */ NULL,                           \
    /* layer_span_bytes */ 0,                        \
    /* page_stride */ 0,                             \
    /* kv_stride */ 0,                               \
    /* token_stride */ 0,                            \
    /* head_stride */ 0                              \
  }
/* Fills *out with SWIFTKV_POOL_DESC_INIT (NULL: nothing). */
SWIFTKV_API void swiftkv_pool_desc_init(swiftkv_pool_desc *out);

/* Registers an engine's own tensors as a pool of borrower `model`; *pool_out is its id (never
 * reused). The descriptor is checked against the model (layers, heads, head dim, dtype) and
 * itself; the message names the field that is wrong. The engine keeps the memory, which must
 * outlive the pool. For a model on a CUDA device the bases are that device's memory, which the
 * context must use (SWIFTKV_ENODEV otherwise). No element of one layer may share an address
 * with an element of another (EINVAL naming the two layers): spans may interleave, as
 * cross-layer pages do, but stream pages alias by mapping, never by address. Thread-safe. */
SWIFTKV_API swiftkv_status swiftkv_pool_register(uint32_t *pool_out, swiftkv_ctx *ctx,
                                                 uint32_t model, const swiftkv_pool_desc *desc);

/* Makes a pool for borrower `model`: `regular_pages` ordinary pages per layer, then
 * `stream_pages` stream pages whose memory is mapped at the same page indices inside every
 * layer's tensor (on the host backend one memfd range mapped once per layer; on a CUDA device
 * one VMM allocation mapped into every layer's address range, SWIFTKV_EUNSUPPORTED where the
 * device lacks VMM), laid out as FlashInfer's NHD. regular_pages is rounded up so that the
 * stream pages start on a memory page (VMM granule) boundary: swiftkv_pool_get tells the counts.
 * The sizes usually come from swiftkv_plan_borrower (regular_blocks, stream_blocks). The memory
 * is the engine's KV memory, not the cache's host budget. */
SWIFTKV_API swiftkv_status swiftkv_pool_create(uint32_t *pool_out, swiftkv_ctx *ctx,
                                               uint32_t model, uint32_t regular_pages,
                                               uint32_t stream_pages);

/* A pool's description (set out->size and out->version first). out->layer_base points into
 * the pool and lives as long as it. */
SWIFTKV_API swiftkv_status swiftkv_pool_get(swiftkv_pool_desc *out, uint32_t *model_out,
                                            const swiftkv_ctx *ctx, uint32_t pool);

/* Ends a pool: SWIFTKV_EBUSY (nothing changed) while a request uses it. A library-made pool's
 * memory is unmapped. */
SWIFTKV_API swiftkv_status swiftkv_pool_destroy(swiftkv_ctx *ctx, uint32_t pool);

/* ---------------------------------------------------------------------------------------------
 * The connector: one engine request, layer by layer (names after vLLM's KV connector).
 *
 *   swiftkv_request_begin      the request's tokens and pages: finds the cached run to load,
 *                              holds it, reserves room for the new chunks, starts reading disk
 *   swiftkv_start_load         starts the loads
 *   for each layer l:
 *     swiftkv_wait_layer_load  layer l of the cached run is in the pages
 *     (the engine computes layer l and writes its new K/V into the pages)
 *     swiftkv_save_layer       the engine is done with layer l: copy the new chunks out of it
 *   swiftkv_wait_save          every layer saved: the new chunks become visible to lookup
 *   swiftkv_request_finish     ends the request (also valid at any earlier point: it aborts)
 *
 * A call out of this order is SWIFTKV_ESTATE with nothing changed; a request id that is not
 * open (finished, or never begun) is SWIFTKV_ENOTFOUND. Calls on one request may come from any
 * thread but not at the same time; requests are independent of each other.
 *
 * Loads: the cached run starts at load_from_tokens and goes on while chunks are cached; each
 * chunk is copied from its tier (peer and host directly, disk through host memory, read and
 * checked at request_begin) into its pages. The chunks are held by the request: a chunk
 * dropped or moved meanwhile stays readable for it. Loads go before saves on the executor.
 * Stream pages hold one layer at a time. When a request loads into or saves out of stream
 * pages, the load of layer l+1 starts only after the save of layer l has copied its chunks out,
 * and swiftkv_wait_layer_load(l+1) returns only then, so the engine may overwrite the stream
 * pages as soon as it returns; otherwise every layer's load starts at swiftkv_start_load.
 * Failures: a chunk whose bytes cannot be trusted (lent memory lost, a checksum mismatch, an
 * I/O error) is never copied into the pages as good data; loads stop at the first such chunk.
 * valid_end_tokens says how far [load_begin_tokens, valid_end_tokens) is intact in every layer
 * so far; it only shrinks. The failed pages are pages[valid_end / block_tokens] up to
 * pages[load_end / block_tokens]: recompute those tokens after swiftkv_request_finish (until
 * then the library may still write pages past valid_end).
 * Saves: every full chunk of the tokens that was neither loaded nor cached at request_begin is
 * copied out of the pages by save_layer, into a slot of the best tier with room (peer first),
 * and made visible by wait_save only once whole. A chunk with no room anywhere is not saved
 * (counted in stores_rejected).
 * Host pools take stream NULL (SWIFTKV_EINVAL otherwise); every call there returns when its
 * work is done (waits) or queued (start_load, save_layer).
 * Device pools take the engine's CUDA stream (NULL: the legacy default stream) and only enqueue:
 * start_load orders the loads after the stream's work so far; wait_layer_load makes the stream
 * wait for layer l's loads (and, when the request reads lent memory, waits on the host for them
 * first, so that the lease is checked after the copy and valid_end_tokens is exact); save_layer
 * copies the layer out after the stream's work so far; wait_save waits on the host for every
 * save. Per layer, one gather/scatter kernel serves every chunk, reading chunks in device
 * memory (lent or mapped) in place and the rest after one copy per chunk into staging; the load's
 * kernels go first on the SMs (copy engines still take copies in the order they were issued).
 * These calls cannot be captured into a CUDA graph: on a device pool, a call whose stream is
 * capturing returns SWIFTKV_EUNSUPPORTED and changes nothing.
 * ------------------------------------------------------------------------------------------- */

#define SWIFTKV_REQUEST_DESC_VERSION 3

/* What a request does (swiftkv_request_desc.shape). */
typedef enum swiftkv_request_shape {
  /* The engine's per-layer loop: start_load, per layer wait_layer_load(l) then save_layer(l),
   * then wait_save. */
  SWIFTKV_REQUEST_LOAD_AND_SAVE = 0,
  /* Loads the cached run into the pages and saves nothing: start_load, then wait_layer_load(l)
   * for l = 0..L-1 in order (an engine that loads first and runs the model after). */
  SWIFTKV_REQUEST_LOAD_ONLY = 1,
  /* Stores pages the engine has computed and loads nothing: save_layer(l) for l = 0..L-1 in
   * order, then wait_save. Chunks cached at request_begin are not saved again. */
  SWIFTKV_REQUEST_SAVE_ONLY = 2
} swiftkv_request_shape;

typedef struct swiftkv_request_desc {
  uint32_t size;              /* sizeof(swiftkv_request_desc) as the caller compiled it */
  uint32_t version;           /* SWIFTKV_REQUEST_DESC_VERSION */
  uint32_t pool;              /* the pool the pages belong to (its model is the request's) */
  uint32_t reserved0;         /* must be 0 */
  const uint32_t *tokens;     /* the whole sequence, cached prefix and new tokens */
  uint64_t n_tokens;
  const int32_t *pages;       /* pages[b]: the pool page of tokens [b*B, (b+1)*B); distinct */
  uint64_t n_pages;           /* at least ceil(n_tokens / block_tokens); extra ones unused */
  uint64_t load_from_tokens;  /* a block boundary where loading starts: 0, the
                                 dropped_head_tokens of swiftkv_lookup, or the end of the blocks
                                 the engine holds already (its own prefix cache). Inside a
                                 chunk, that chunk loads from here on and the pages before
                                 load_from_tokens are not touched */
  /* Version 2. */
  swiftkv_request_shape shape; /* default SWIFTKV_REQUEST_LOAD_AND_SAVE. A load-only or
                                  save-only request cannot use stream pages (EINVAL): they hold
                                  one layer at a time, and only the interleaved loop says when
                                  a layer is done with. Calls of the half a shape lacks are
                                  SWIFTKV_ESTATE. */
  uint32_t reserved1;          /* must be 0 */
  /* Version 3. */
  const void *names;           /* the request's full chunks named by the caller (see "Chunks
                                  named by the caller"): names_bytes / name_bytes names, one
                                  per full chunk of the n_tokens tokens, exactly; tokens may
                                  then be NULL. NULL (default): chunks are named by tokens */
  uint64_t names_bytes;
  uint32_t name_bytes;         /* 1 to SWIFTKV_MAX_CHUNK_NAME_BYTES with names; 0 without */
  uint32_t reserved2;          /* must be 0 */
} swiftkv_request_desc;

#define SWIFTKV_REQUEST_DESC_INIT                       \
  {                                                     \
    /* size */ (uint32_t)sizeof(swiftkv_request_desc),  \
    /* version */ SWIFTKV_REQUEST_DESC_VERSION,         \
    /* pool */ 0,                                       \
    /* reserved0 */ 0,                                  \
    /* tokens */ NULL,                                  \
    /* n_tokens */ 0,                                   \
    /* pages */ NULL,                                   \
    /* n_pages */ 0,                                    \
    /* load_from_tokens */ 0,                           \
    /* shape */ SWIFTKV_REQUEST_LOAD_AND_SAVE,          \
    /* reserved1 */ 0,                                  \
    /* names */ NULL,                                   \
    /* names_bytes */ 0,                                \
    /* name_bytes */ 0,                                 \
    /* reserved2 */ 0                                   \
  }
/* Fills *out with SWIFTKV_REQUEST_DESC_INIT (NULL: nothing). */
SWIFTKV_API void swiftkv_request_desc_init(swiftkv_request_desc *out);

#define SWIFTKV_REQUEST_INFO_VERSION 1

typedef struct swiftkv_request_info {
  uint32_t size;                /* set by the caller: SWIFTKV_REQUEST_INFO_INIT */
  uint32_t version;
  uint64_t load_begin_tokens;   /* first token loaded */
  uint64_t load_end_tokens;     /* end of the cached run found at request_begin */
  uint64_t valid_end_tokens;    /* [load_begin, valid_end) intact in every layer waited for */
  uint64_t save_tokens;         /* tokens in the chunks the request will save */
  uint64_t saved_tokens;        /* tokens in the chunks wait_save made visible */
  uint32_t layers_loaded;       /* layers the engine has waited for */
  uint32_t layers_saved;        /* layers handed to save_layer */
  uint32_t stream_ordered;      /* 1: stream pages are loaded or saved, so layer l+1 comes
                                   after the save of layer l */
  uint32_t reserved0;
} swiftkv_request_info;

#define SWIFTKV_REQUEST_INFO_INIT \
  { (uint32_t)sizeof(swiftkv_request_info), SWIFTKV_REQUEST_INFO_VERSION, 0, 0, 0, 0, 0, 0, 0, 0, 0 }
/* Fills *out with SWIFTKV_REQUEST_INFO_INIT (NULL: nothing). */
SWIFTKV_API void swiftkv_request_info_init(swiftkv_request_info *out);

/* Begins a request; *request_out is its id. EINVAL: tokens, pages (out of the pool, repeated,
 * too few) or load_from_tokens (not a block boundary, past the tokens) are wrong; ENOTFOUND: an
 * unknown pool; EBUSY: config->max_open_requests requests are open (nothing held or reserved). */
SWIFTKV_API swiftkv_status swiftkv_request_begin(uint64_t *request_out, swiftkv_ctx *ctx,
                                                 const swiftkv_request_desc *desc);
SWIFTKV_API swiftkv_status swiftkv_start_load(swiftkv_ctx *ctx, uint64_t request, void *stream);
/* *valid_end_tokens_out: see valid_end_tokens above. */
SWIFTKV_API swiftkv_status swiftkv_wait_layer_load(uint64_t *valid_end_tokens_out,
                                                   swiftkv_ctx *ctx, uint64_t request,
                                                   uint32_t layer, void *stream);
SWIFTKV_API swiftkv_status swiftkv_save_layer(swiftkv_ctx *ctx, uint64_t request, uint32_t layer,
                                              void *stream);
/* The per-layer hooks for a whole batch: the same as swiftkv_wait_layer_load (or
 * swiftkv_save_layer) for requests[0], requests[1], ... in order, with one `layer` and one
 * `stream`, in one call, as an engine calls per layer for all of a step's requests. The requests
 * may belong to different pools; a host pool's takes stream NULL (EINVAL otherwise).
 * Every request is checked before any is touched: one not open (ENOTFOUND), one named twice
 * or a layer past a request's model (EINVAL), or a call out of order for one of them (ESTATE)
 * fails the call with nothing changed and nothing written to valid_ends_out. A capturing
 * stream is EUNSUPPORTED, also with nothing changed. valid_ends_out[i] is what
 * swiftkv_wait_layer_load would give for requests[i]. n_requests 0 does nothing (the arrays
 * may then be NULL).
 * On a device pool a request with nothing to copy (no chunk to load or save: a decode step
 * between chunk boundaries) makes no CUDA call, here or in the per-request calls. */
SWIFTKV_API swiftkv_status swiftkv_wait_layer_load_batch(uint64_t *valid_ends_out,
                                                         swiftkv_ctx *ctx, const uint64_t *requests,
                                                         size_t n_requests, uint32_t layer,
                                                         void *stream);
SWIFTKV_API swiftkv_status swiftkv_save_layer_batch(swiftkv_ctx *ctx, const uint64_t *requests,
                                                    size_t n_requests, uint32_t layer,
                                                    void *stream);
/* *saved_tokens_out: tokens in the chunks made visible. */
SWIFTKV_API swiftkv_status swiftkv_wait_save(uint64_t *saved_tokens_out, swiftkv_ctx *ctx,
                                             uint64_t request, void *stream);
SWIFTKV_API swiftkv_status swiftkv_request_info_get(swiftkv_request_info *out,
                                                    const swiftkv_ctx *ctx, uint64_t request);
/* Ends a request, waiting for its copies in flight; out (may be NULL) gets its final info. The
 * chunks it held and the room it reserved but did not fill are given back. */
SWIFTKV_API swiftkv_status swiftkv_request_finish(swiftkv_request_info *out, swiftkv_ctx *ctx,
                                                  uint64_t request);

/* ---------------------------------------------------------------------------------------------
 * Multi-token paged attention (Pensieve §4.4): one call for prefill and decode over KV scattered
 * across pages (regular and stream pages alike), for a batch of sub-requests.
 *
 * Sub-request r has q_len = qo_indptr[r+1] - qo_indptr[r] query tokens (rows
 * [qo_indptr[r], qo_indptr[r+1]) of q and out) and the KV held by its pages
 * kv_indices[kv_indptr[r] .. kv_indptr[r+1]) in order, all full but the last, which holds
 * kv_last_page_len[r] tokens (1..page_tokens; a sub-request with no pages has kv_len 0):
 *   kv_len = (pages - 1) * page_tokens + kv_last_page_len[r].
 * Query head h reads KV head h / (num_qo_heads / num_kv_heads) (GQA). With `causal`, query i
 * (0-based in its sub-request) sees keys [0, kv_len - q_len + i]: the queries are the last
 * q_len tokens of the KV. So "the dropped prefix attends to itself; the new prompt attends to
 * everything" is two sub-requests over the same pages: one with the dropped range's queries
 * and pages, one with the new tokens' queries and all pages. Logits are
 *   s = sm_scale * (q . k), then cap * tanh(s / cap) when logits_soft_cap = cap > 0;
 * out = softmax(s) . v, and lse = ln(sum exp(s)) (natural log) per (query token, head). A query
 * that sees no key gets out = 0 and lse = -INFINITY.
 *
 * Plan / run: swiftkv_attention_plan reads the batch's lengths on the host and writes the work
 * partition (query tiles x KV heads x KV pieces: long KV is split and merged after) into the
 * caller's workspace; swiftkv_attention_run reads only the workspace and the tensors, allocates
 * nothing and does not synchronise, so a run on a device can be captured in a CUDA graph. The
 * graph keeps the plan it was captured with: its grid, tile size and work counts are fixed in
 * the graph, and it reads the work list from the workspace when it replays. So a new plan
 * written into that workspace makes the graph wrong: plan once per captured shape and keep one
 * workspace per graph, or capture again after planning. A plan is valid for any run with the
 * same lengths; make a new plan when they change.
 *
 * Where the memory is: with desc.device = SWIFTKV_DEVICE_HOST every pointer is host memory and
 * the CPU path computes (fp64 accumulation, then rounded to the dtype); with a CUDA device,
 * workspace, q, k, v, kv_indices, out and lse are that device's memory (the plan's host arrays
 * stay host memory) and the kernels accumulate in fp32 (FlashInfer's batch prefill where it takes
 * the batch, the library's own kernel otherwise: docs/attention.md). On a device, q, k_base and
 * v_base must be 16-byte aligned and the q and K/V strides multiples of 8 elements (EINVAL
 * otherwise), and page ids are not checked against num_pages (the host cannot see them without a
 * copy): an id out of range gives undefined rows and may be read; on the host every id a run
 * reads is checked (a sub-request without queries reads no page).
 * ------------------------------------------------------------------------------------------- */

#define SWIFTKV_ATTENTION_DESC_VERSION 1

typedef struct swiftkv_attention_desc {
  uint32_t size;              /* sizeof(swiftkv_attention_desc) as the caller compiled it */
  uint32_t version;           /* SWIFTKV_ATTENTION_DESC_VERSION */
  int32_t device;             /* SWIFTKV_DEVICE_HOST (default) or a CUDA device ordinal */
  swiftkv_dtype dtype;        /* of q, k, v and out: F16 or BF16; F32 on the host only */
  uint32_t num_qo_heads;      /* query heads, a multiple of num_kv_heads */
  uint32_t num_kv_heads;      /* KV heads (>= 1) */
  uint32_t head_dim;          /* 64, 128 or 256 */
  uint32_t page_tokens;       /* tokens per page, 1..256 */
  uint32_t causal;            /* 1: causal, aligned to the end of each sub-request's KV; 0: none */
  uint32_t kv_chunk_tokens;   /* 0: the plan splits long KV as the device needs; > 0: split
                                 every sub-request's KV into pieces of this many tokens (a
                                 multiple of 16), which tests and tuning use */
  float sm_scale;             /* > 0; 0 means 1 / sqrt(head_dim) */
  float logits_soft_cap;      /* >= 0; 0 means no cap */
} swiftkv_attention_desc;

#define SWIFTKV_ATTENTION_DESC_INIT                       \
  {                                                       \
    /* size */ (uint32_t)sizeof(swiftkv_attention_desc),  \
    /* version */ SWIFTKV_ATTENTION_DESC_VERSION,         \
    /* device */ SWIFTKV_DEVICE_HOST,                     \
    /* dtype */ SWIFTKV_DTYPE_F16,                        \
    /* num_qo_heads */ 0,                                 \
    /* num_kv_heads */ 0,                                 \
    /* head_dim */ 0,                                     \
    /* page_tokens */ 16,                                 \
    /* causal */ 1,                                       \
    /* kv_chunk_tokens */ 0,                              \
    /* sm_scale */ 0.0f,                                  \
    /* logits_soft_cap */ 0.0f                            \
  }
/* Fills *out with SWIFTKV_ATTENTION_DESC_INIT (NULL: nothing). */
SWIFTKV_API void swiftkv_attention_desc_init(swiftkv_attention_desc *out);

#define SWIFTKV_ATTENTION_PLAN_VERSION 1

/* What a plan made. The counts are for the caller to read; `internal` is the library's (the
 * description and where the plan lies in the workspace, with a check word): pass the struct to
 * swiftkv_attention_run unchanged. */
typedef struct swiftkv_attention_plan {
  uint32_t size;              /* set by the caller: SWIFTKV_ATTENTION_PLAN_INIT */
  uint32_t version;
  uint32_t n_requests;        /* sub-requests in the batch */
  uint32_t work_items;        /* (query tile, KV head, KV piece) units a run computes */
  uint64_t q_tokens;          /* query rows: qo_indptr[n_requests] */
  uint64_t kv_tokens;         /* sum of the sub-requests' kv_len */
  uint32_t split_requests;    /* sub-requests whose KV is split into pieces (merged after) */
  uint32_t max_kv_pieces;     /* the most pieces one sub-request's KV is split into */
  uint64_t workspace_bytes;   /* bytes of the workspace the plan uses */
  uint64_t internal[12];
} swiftkv_attention_plan;

#define SWIFTKV_ATTENTION_PLAN_INIT                                                           \
  {                                                                                          \
    (uint32_t)sizeof(swiftkv_attention_plan), SWIFTKV_ATTENTION_PLAN_VERSION, 0, 0, 0, 0, 0, \
        0, 0, { 0 }                                                                          \
  }
/* Fills *out with SWIFTKV_ATTENTION_PLAN_INIT (NULL: nothing). */
SWIFTKV_API void swiftkv_attention_plan_init(swiftkv_attention_plan *out);

#define SWIFTKV_ATTENTION_ARGS_VERSION 1

/* The tensors of one run. Strides are in elements, the dim stride is 1. Element (token t,
 * head h, dim d) of q is q[t*q_token_stride + h*q_head_stride + d], of out likewise. Element
 * (page p, token t, KV head h, dim d) of K is at k_base + (p*page_stride + t*token_stride +
 * h*head_stride + d) elements, of V likewise from v_base. That covers vLLM's
 * [2, pages, B, H, D] (v_base = k_base + pages*B*H*D), FlashInfer's NHD and HND, cross-layer
 * pages [pages, L, 2, B, H, D] (the layer's K as k_base) and the library's own pools
 * (swiftkv_pool_get: k_base = layer_base[l], v_base = k_base + kv_stride). A run checks only
 * what it reads: with no query tokens q, out and their strides are not read (NULL and 0 pass), with
 * no KV tokens k_base, v_base, kv_indices, num_pages and the page strides likewise. */
typedef struct swiftkv_attention_args {
  uint32_t size;              /* sizeof(swiftkv_attention_args) as the caller compiled it */
  uint32_t version;           /* SWIFTKV_ATTENTION_ARGS_VERSION */
  const void *q;              /* [q_tokens, num_qo_heads, head_dim] */
  int64_t q_token_stride;     /* >= 1 */
  int64_t q_head_stride;      /* >= 1 */
  const void *k_base;         /* page 0, token 0, head 0 of K */
  const void *v_base;         /* page 0, token 0, head 0 of V */
  int64_t page_stride;        /* >= 1 */
  int64_t token_stride;       /* >= 1 */
  int64_t head_stride;        /* >= 1 */
  uint32_t num_pages;         /* pages the bases reach: every page id must be below */
  uint32_t reserved0;         /* must be 0 */
  const int32_t *kv_indices;  /* [kv_indptr[n_requests]] page ids, as given to the plan */
  void *out;                  /* [q_tokens, num_qo_heads, head_dim], the dtype */
  int64_t out_token_stride;   /* >= 1 */
  int64_t out_head_stride;    /* >= 1 */
  float *lse;                 /* [q_tokens, num_qo_heads] fp32, or NULL: not written */
} swiftkv_attention_args;

#define SWIFTKV_ATTENTION_ARGS_INIT                       \
  {                                                       \
    /* size */ (uint32_t)sizeof(swiftkv_attention_args),  \
    /* version */ SWIFTKV_ATTENTION_ARGS_VERSION,         \
    /* q */ NULL,                                         \
    /* q_token_stride */ 0,                               \
    /* q_head_stride */ 0,                                \
    /* k_base */ NULL,                                    \
    /* v_base */ NULL,                                    \
    /* page_stride */ 0,                                  \
    /* token_stride */ 0,                                 \
    /* head_stride */ 0,                                  \
    /* num_pages */ 0,                                    \
    /* reserved0 */ 0,                                    \
    /* kv_indices */ NULL,                                \
    /* out */ NULL,                                       \
    /* out_token_stride */ 0,                             \
    /* out_head_stride */ 0,                              \
    /* lse */ NULL                                        \
  }
/* Fills *out with SWIFTKV_ATTENTION_ARGS_INIT (NULL: nothing). */
SWIFTKV_API void swiftkv_attention_args_init(swiftkv_attention_args *out);

/* The workspace bytes any batch of at most max_requests sub-requests and max_q_tokens query
 * tokens needs under `desc` (with room for the plan's KV splits). Pure; thread-safe. */
SWIFTKV_API swiftkv_status swiftkv_attention_workspace_size(uint64_t *bytes_out,
                                                            const swiftkv_attention_desc *desc,
                                                            uint32_t max_requests,
                                                            uint64_t max_q_tokens);

/* Plans a batch: qo_indptr and kv_indptr ([n_requests + 1], starting at 0, non-decreasing) and
 * kv_last_page_len ([n_requests]) are host memory. The work list goes into `workspace` (256-byte
 * aligned, in the device's memory, workspace_bytes long; ENOMEM when too small: the message
 * says how much). KV pieces are fewer when the workspace has no room for more. On a device the
 * plan is copied with cudaMemcpyAsync on `stream` from pageable memory, which returns once the
 * bytes are staged (a host synchronisation); on the host, stream must be NULL. Thread-safe;
 * one workspace holds one plan at a time. */
SWIFTKV_API swiftkv_status swiftkv_attention_plan_make(swiftkv_attention_plan *out,
                                                       const swiftkv_attention_desc *desc,
                                                       const int32_t *qo_indptr,
                                                       const int32_t *kv_indptr,
                                                       const int32_t *kv_last_page_len,
                                                       uint32_t n_requests, void *workspace,
                                                       uint64_t workspace_bytes, void *stream);

/* Runs a plan over the tensors in `args`; `workspace` must be the plan's. On the host it
 * returns when out and lse are written; on a device it enqueues on `stream` (NULL: the legacy
 * default stream) and returns: out and lse are written when the stream gets there, and the
 * workspace must not be planned into again before then. EINVAL: an argument contradicts the
 * plan or itself (on the host also a page id out of range, with out untouched; on a device also
 * tensors not 16-byte aligned). EUNSUPPORTED: SWIFTKV_ATTENTION_KERNEL=flashinfer and FlashInfer's
 * kernel cannot run this batch (the message says why). */
SWIFTKV_API swiftkv_status swiftkv_attention_run(const swiftkv_attention_plan *plan,
                                                 const swiftkv_attention_args *args,
                                                 void *workspace, void *stream);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* SWIFTKV_SWIFTKV_H */

/* SWIG interface of the Python binding: the public header wrapped as it is, with typemaps that
 * make it callable from Python without ctypes:
 *   - a negative swiftkv_status raises swiftkv.Error(status, message); a call returns its status
 *     (OK or IN_PROGRESS) followed by its outputs;
 *   - output pointers (uint64_t *x_out, handles T **out) become return values;
 *   - (pointer, length) pairs take any object with the buffer protocol (numpy arrays, bytes,
 *     bytearray, memoryview) of the right item size;
 *   - every other raw pointer (streams, tensors, struct fields) takes an int address (an engine
 *     tensor's data_ptr()), None for NULL, or a buffer, and reads back as an int;
 *   - the GIL is released around every call (-threads), and callbacks into Python take it.
 * The module is swiftkv.capi (its C half swiftkv._capi); the Pythonic layer is
 * swiftkv/__init__.py. */
%module(package="swiftkv", threads="1") capi

%{
#define SWIG_FILE_WITH_INIT
#include "swiftkv/swiftkv.h"

static PyObject *swiftkv_py_error = NULL;          /* the base class, swiftkv.Error */
static PyObject *swiftkv_py_error_classes = NULL;  /* status -> its subclass (the package's) */

/* Raises swiftkv.Error (the subclass of the status) for a failed status; 0 when it raised. */
static int swiftkv_py_check(swiftkv_status st) {
  if (st >= 0) return 1;
  SWIG_PYTHON_THREAD_BEGIN_BLOCK;
  PyObject *args = Py_BuildValue("(is)", (int)st, swiftkv_last_error_message());
  PyObject *cls = swiftkv_py_error;
  if (swiftkv_py_error_classes != NULL) {
    PyObject *key = PyLong_FromLong((long)st);
    PyObject *sub = key == NULL ? NULL : PyDict_GetItemWithError(swiftkv_py_error_classes, key);
    Py_XDECREF(key);
    if (sub != NULL) cls = sub;
    PyErr_Clear();
  }
  PyErr_SetObject(cls, args);
  Py_XDECREF(args);
  SWIG_PYTHON_THREAD_END_BLOCK;
  return 0;
}

/* A raw pointer from Python: None, an int address, a SWIG pointer, or a buffer (its address;
 * the caller keeps the object alive). */
static int swiftkv_py_pointer(PyObject *o, void **out, int writable) {
  if (o == Py_None) {
    *out = NULL;
    return 1;
  }
  if (PyLong_Check(o)) {
    *out = PyLong_AsVoidPtr(o);
    return PyErr_Occurred() == NULL;
  }
  if (SWIG_ConvertPtr(o, out, 0, 0) == SWIG_OK) return 1;
  Py_buffer view;
  if (PyObject_GetBuffer(o, &view, writable ? PyBUF_WRITABLE : PyBUF_SIMPLE) == 0) {
    *out = view.buf;
    PyBuffer_Release(&view);
    return 1;
  }
  PyErr_Clear();
  PyErr_SetString(PyExc_TypeError, "expected an int address, None or a buffer");
  return 0;
}

/* A contiguous buffer of items of `itemsize` bytes (0: bytes of any item size). */
static int swiftkv_py_buffer(PyObject *o, Py_buffer *view, int writable, Py_ssize_t itemsize,
                             const char *what) {
  int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT;
  if (writable) flags |= PyBUF_WRITABLE;
  if (PyObject_GetBuffer(o, view, flags) != 0) {
    PyErr_Clear();
    PyErr_Format(PyExc_TypeError, "%s: expected a C-contiguous%s buffer (a numpy array, bytes)",
                 what, writable ? " writable" : "");
    return 0;
  }
  if (itemsize != 0 && view->itemsize != itemsize) {
    PyErr_Format(PyExc_TypeError, "%s: expected items of %zd bytes, got %zd", what, itemsize,
                 view->itemsize);
    PyBuffer_Release(view);
    return 0;
  }
  return 1;
}

/* --- Callbacks into Python ---------------------------------------------------------------- */

static void swiftkv_py_event_trampoline(const swiftkv_chunk_event *e, void *user_data) {
  PyGILState_STATE g = PyGILState_Ensure();
  PyObject *r = PyObject_CallFunction((PyObject *)user_data, "(IiiiKK)", e->model, (int)e->from,
                                      (int)e->to, (int)e->reason, (unsigned long long)e->key_lo,
                                      (unsigned long long)e->key_hi);
  if (r == NULL) PyErr_WriteUnraisable((PyObject *)user_data);
  Py_XDECREF(r);
  PyGILState_Release(g);
}

static uint64_t swiftkv_py_clock_trampoline(void *user_data) {
  PyGILState_STATE g = PyGILState_Ensure();
  uint64_t v = 0;
  PyObject *r = PyObject_CallNoArgs((PyObject *)user_data);
  if (r != NULL) v = PyLong_AsUnsignedLongLong(r);
  if (r == NULL || PyErr_Occurred()) PyErr_WriteUnraisable((PyObject *)user_data);
  Py_XDECREF(r);
  PyGILState_Release(g);
  return v;
}
%}

%init %{
  swiftkv_py_error = PyErr_NewException("swiftkv.Error", NULL, NULL);
  Py_INCREF(swiftkv_py_error);
  PyModule_AddObject(m, "Error", swiftkv_py_error);
%}

%pythoncode %{
Error = _capi.Error
%}

%include <stdint.i>
%include <typemaps.i>

/* The header's export attribute means nothing to SWIG. */
#define __attribute__(x)

/* These handle Python objects, so they keep the GIL. */
%nothread swiftkv_py_pointer_array;
%nothread swiftkv_py_address;
%nothread swiftkv_py_lookup;
%nothread swiftkv_py_set_error_classes;

/* --- Statuses ------------------------------------------------------------------------------ */
%typemap(out) swiftkv_status {
  if (!swiftkv_py_check($1)) SWIG_fail;
  $result = PyLong_FromLong((long)$1);
}

/* swiftkv_store keeps the chunks it wrote before a failure and says how many tokens they are:
 * its status comes back unraised, with that count, and swiftkv.Model.store raises with both. */
%typemap(out) swiftkv_status swiftkv_store { $result = PyLong_FromLong((long)$1); }
%typemap(out) swiftkv_status swiftkv_store_named { $result = PyLong_FromLong((long)$1); }

/* --- Outputs ------------------------------------------------------------------------------- */
%apply uint64_t *OUTPUT {
  uint64_t *out, uint64_t *borrower_blocks_out, uint64_t *lender_blocks_out,
  uint64_t *borrower_chunks_out, uint64_t *lender_delta_out, uint64_t *borrower_delta_out,
  uint64_t *cached_tokens_out, uint64_t *loaded_tokens_out, uint64_t *lease_id_out,
  uint64_t *cleared_chunks_out, uint64_t *chunks_there_out, uint64_t *request_out,
  uint64_t *valid_end_tokens_out, uint64_t *saved_tokens_out, uint64_t *bytes_out,
  uint64_t *chunks_out, uint64_t *cached_chunks_out, uint64_t *loaded_chunks_out
};
%apply uint32_t *OUTPUT { uint32_t *out, uint32_t *model_out, uint32_t *pool_out };
%apply size_t *OUTPUT { size_t *count_out, size_t *length_out, size_t *chunks_out };

%define SWIFTKV_HANDLE_OUT(TYPE)
%typemap(in, numinputs=0) TYPE **out (TYPE *tmp = NULL) { $1 = &tmp; }
%typemap(argout) TYPE **out {
  $result = SWIG_Python_AppendOutput($result,
                                     SWIG_NewPointerObj(SWIG_as_voidptr(*$1), $*1_descriptor, 0));
}
%enddef
SWIFTKV_HANDLE_OUT(swiftkv_ctx)
SWIFTKV_HANDLE_OUT(swiftkv_elastic)

/* --- (pointer, length) buffers -------------------------------------------------------------- */
%define SWIFTKV_BUFFER_IN(PTR, LEN, ITEM, WRITABLE)
%typemap(in) (PTR, LEN) (Py_buffer view, int have = 0) {
  if ($input == Py_None) {
    $1 = NULL;
    $2 = 0;
  } else {
    if (!swiftkv_py_buffer($input, &view, WRITABLE, ITEM, "$symname")) SWIG_fail;
    have = 1;
    $1 = ($1_ltype)view.buf;
    $2 = (size_t)(ITEM == 0 ? view.len : view.len / (ITEM == 0 ? 1 : ITEM));
  }
}
%typemap(freearg) (PTR, LEN) { if (have$argnum) PyBuffer_Release(&view$argnum); }
%enddef
SWIFTKV_BUFFER_IN(const uint32_t *tokens, size_t n_tokens, 4, 0)
SWIFTKV_BUFFER_IN(const void *names, size_t names_bytes, 0, 0)
SWIFTKV_BUFFER_IN(const void *kv, size_t kv_bytes, 0, 0)
SWIFTKV_BUFFER_IN(void *kv, size_t kv_bytes, 0, 1)
SWIFTKV_BUFFER_IN(uint8_t *residency_out, size_t residency_capacity, 1, 1)
SWIFTKV_BUFFER_IN(const uint64_t *lender_kv_bytes, size_t n_lenders, 8, 0)
SWIFTKV_BUFFER_IN(const uint64_t *requests, size_t n_requests, 8, 0)
SWIFTKV_BUFFER_IN(uint64_t *ids_out, size_t ids_capacity, 8, 1)
SWIFTKV_BUFFER_IN(uint64_t *keys_out, size_t keys_capacity, 8, 1)
SWIFTKV_BUFFER_IN(char *buf, size_t capacity, 1, 1)
SWIFTKV_BUFFER_IN(swiftkv_chunk_info *info_out, size_t info_capacity, 16, 1)

/* --- Raw pointers ---------------------------------------------------------------------------- */
%define SWIFTKV_RAW_POINTER(TYPE, WRITABLE)
%typemap(in) TYPE {
  void *p = NULL;
  if (!swiftkv_py_pointer($input, &p, WRITABLE)) SWIG_fail;
  $1 = ($1_ltype)p;
}
%typemap(typecheck, precedence=SWIG_TYPECHECK_POINTER) TYPE { $1 = 1; }
%typemap(out) TYPE { $result = PyLong_FromVoidPtr((void *)$1); }
%typemap(memberin) TYPE { $1 = $input; }
%enddef
SWIFTKV_RAW_POINTER(void *, 1)
SWIFTKV_RAW_POINTER(const void *, 0)
SWIFTKV_RAW_POINTER(const int32_t *, 0)
SWIFTKV_RAW_POINTER(float *, 1)
SWIFTKV_RAW_POINTER(uint64_t *valid_ends_out, 1) /* a uint64 array of the batch's size */
SWIFTKV_RAW_POINTER(const double *, 0)
SWIFTKV_RAW_POINTER(void *const *, 0)
SWIFTKV_RAW_POINTER(const uint32_t *, 0)

/* Fixed arrays in structs (per-tier counts, the plan's internal words) read as lists. */
%typemap(out) uint64_t [ANY] {
  $result = PyList_New($1_dim0);
  for (Py_ssize_t i = 0; i < $1_dim0; ++i) {
    PyList_SetItem($result, i, PyLong_FromUnsignedLongLong((unsigned long long)$1[i]));
  }
}

/* The codec counts: a list of rows (per codec) of per-tier counts. */
%typemap(out) uint64_t [ANY][ANY] {
  $result = PyList_New($1_dim0);
  for (Py_ssize_t i = 0; i < $1_dim0; ++i) {
    PyObject *row = PyList_New($1_dim1);
    for (Py_ssize_t j = 0; j < $1_dim1; ++j) {
      PyList_SetItem(row, j, PyLong_FromUnsignedLongLong((unsigned long long)$1[i][j]));
    }
    PyList_SetItem($result, i, row);
  }
}

/* Callbacks are set through the helpers below, never as raw fields. */
%ignore swiftkv_set_chunk_event_callback;
/* Wrapped below as functions that return the struct. */
%ignore swiftkv_model_desc_init;
%ignore swiftkv_capacity_plan_init;
%ignore swiftkv_ctx_config_init;
%ignore swiftkv_elastic_config_init;
%ignore swiftkv_layer_view_init;
%ignore swiftkv_lease_init;
%ignore swiftkv_elastic_stats_init;
%ignore swiftkv_model_config_init;
%ignore swiftkv_lookup_result_init;
%ignore swiftkv_stats_init;
%ignore swiftkv_coord_stats_init;
%ignore swiftkv_codec_params_init;
%ignore swiftkv_compression_config_init;
%ignore swiftkv_compression_method_init;
%ignore swiftkv_codec_stats_init;
%ignore swiftkv_pool_desc_init;
%ignore swiftkv_request_desc_init;
%ignore swiftkv_request_info_init;
%ignore swiftkv_attention_desc_init;
%ignore swiftkv_attention_plan_init;
%ignore swiftkv_attention_args_init;
%immutable swiftkv_ctx_config::clock;
%immutable swiftkv_ctx_config::clock_user_data;
%immutable swiftkv_elastic_config::clock;
%immutable swiftkv_elastic_config::clock_user_data;

/* The library copies every string it keeps (names, paths, endpoints); the Pythonic layer keeps
 * the Python strings alive while a struct that points to them is in use. */
%typemap(memberin) const char * { $1 = $input; }
%typemap(in) const char * (PyObject *bytes = NULL) {
  if ($input == Py_None) {
    $1 = NULL;
  } else if (PyUnicode_Check($input)) {
    $1 = (char *)PyUnicode_AsUTF8($input);
    if ($1 == NULL) SWIG_fail;
  } else if (PyBytes_Check($input)) {
    $1 = PyBytes_AsString($input);
  } else {
    PyErr_SetString(PyExc_TypeError, "expected str, bytes or None");
    SWIG_fail;
  }
}
%typemap(typecheck, precedence=SWIG_TYPECHECK_STRING) const char * { $1 = 1; }
%typemap(freearg) const char * ""

%include "swiftkv/swiftkv.h"

/* Constants whose values SWIG's preprocessor cannot evaluate: the C compiler does. */
%inline %{
uint64_t swiftkv_py_lease_all(void) { return SWIFTKV_LEASE_ALL; }
uint32_t swiftkv_py_model_all(void) { return SWIFTKV_MODEL_ALL; }
uint64_t swiftkv_py_device_mask_all(void) { return SWIFTKV_DEVICE_MASK_ALL; }
%}

/* --- Defaults from the library's swiftkv_<struct>_init, and callback helpers -------------------
 * Python gets each as swiftkv_<struct>_init() returning the struct (the C function fills a
 * pointer, which SWIG would not turn into a return value). */
%define SWIFTKV_INIT(TYPE)
%rename(TYPE ## _init) swiftkv_py_ ## TYPE ## _defaults;
%inline %{
TYPE swiftkv_py_ ## TYPE ## _defaults(void) {
  TYPE v;
  TYPE ## _init(&v);
  return v;
}
%}
%enddef
SWIFTKV_INIT(swiftkv_model_desc)
SWIFTKV_INIT(swiftkv_capacity_plan)
SWIFTKV_INIT(swiftkv_ctx_config)
SWIFTKV_INIT(swiftkv_elastic_config)
SWIFTKV_INIT(swiftkv_layer_view)
SWIFTKV_INIT(swiftkv_lease)
SWIFTKV_INIT(swiftkv_elastic_stats)
SWIFTKV_INIT(swiftkv_model_config)
SWIFTKV_INIT(swiftkv_lookup_result)
SWIFTKV_INIT(swiftkv_stats)
SWIFTKV_INIT(swiftkv_codec_params)
SWIFTKV_INIT(swiftkv_compression_config)
SWIFTKV_INIT(swiftkv_compression_method)
SWIFTKV_INIT(swiftkv_codec_stats)
SWIFTKV_INIT(swiftkv_coord_stats)
SWIFTKV_INIT(swiftkv_pool_desc)
SWIFTKV_INIT(swiftkv_request_desc)
SWIFTKV_INIT(swiftkv_request_info)
SWIFTKV_INIT(swiftkv_attention_desc)
SWIFTKV_INIT(swiftkv_attention_plan)
SWIFTKV_INIT(swiftkv_attention_args)

%inline %{
/* Sets (fn None: removes) the chunk event callback: fn(model, from, to, reason, key_lo, key_hi)
 * runs on a library thread with the GIL taken. Returns the callable now held (the Pythonic layer
 * keeps it and releases the previous one after this returns). */
swiftkv_status swiftkv_py_set_chunk_event_callback(swiftkv_ctx *ctx, PyObject *fn) {
  if (fn == Py_None) return swiftkv_set_chunk_event_callback(ctx, NULL, NULL);
  return swiftkv_set_chunk_event_callback(ctx, swiftkv_py_event_trampoline, fn);
}

/* Sets methods[i] of a compression config (SWIG gives the array read-only); false when i is not
 * below SWIFTKV_MAX_COMPRESSION_METHODS. */
int swiftkv_py_compression_config_set_method(swiftkv_compression_config *c, uint32_t i,
                                             swiftkv_codec_params params, double quality,
                                             double decode_gbps) {
  if (i >= SWIFTKV_MAX_COMPRESSION_METHODS) return 0;
  c->methods[i].params = params;
  c->methods[i].quality = quality;
  c->methods[i].decode_gbps = decode_gbps;
  return 1;
}

/* Points a config's clock at a Python callable returning nanoseconds (None: CLOCK_MONOTONIC). The
 * caller keeps fn alive as long as the context or region. */
void swiftkv_py_ctx_config_set_clock(swiftkv_ctx_config *c, PyObject *fn) {
  c->clock = fn == Py_None ? NULL : swiftkv_py_clock_trampoline;
  c->clock_user_data = fn == Py_None ? NULL : fn;
}
void swiftkv_py_elastic_config_set_clock(swiftkv_elastic_config *c, PyObject *fn) {
  c->clock = fn == Py_None ? NULL : swiftkv_py_clock_trampoline;
  c->clock_user_data = fn == Py_None ? NULL : fn;
}

/* An array of layer base addresses for swiftkv_pool_desc.layer_base, owned by the caller. */
PyObject *swiftkv_py_pointer_array(PyObject *addresses) {
  PyObject *seq = PySequence_Fast(addresses, "expected a sequence of addresses");
  if (seq == NULL) return NULL;
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  PyObject *bytes = PyBytes_FromStringAndSize(NULL, n * (Py_ssize_t)sizeof(void *));
  if (bytes == NULL) {
    Py_DECREF(seq);
    return NULL;
  }
  void **p = (void **)PyBytes_AsString(bytes);
  for (Py_ssize_t i = 0; i < n; ++i) {
    p[i] = PyLong_AsVoidPtr(PySequence_Fast_GET_ITEM(seq, i));
    if (PyErr_Occurred()) {
      Py_DECREF(seq);
      Py_DECREF(bytes);
      return NULL;
    }
  }
  Py_DECREF(seq);
  return bytes;
}

/* The address of a buffer's first byte (a numpy array's data), as an int. */
PyObject *swiftkv_py_address(PyObject *o) {
  Py_buffer view;
  if (PyObject_GetBuffer(o, &view, PyBUF_SIMPLE) != 0) return NULL;
  PyObject *r = PyLong_FromVoidPtr(view.buf);
  PyBuffer_Release(&view);
  return r;
}

/* Model.lookup in one call with no struct proxies (a lookup is on an engine's hot path): tokens
 * is a C-contiguous buffer of uint32 (format "I"), used in place. Returns (chunks, prefix_tokens,
 * dropped_head_tokens, loadable_tokens, (peer, host, disk), residency) with residency a
 * bytearray of one swiftkv_tier per full chunk. The GIL is released around the lookup. */
PyObject *swiftkv_py_lookup(swiftkv_ctx *ctx, uint32_t model, PyObject *tokens,
                            uint32_t chunk_tokens) {
  Py_buffer view;
  if (!swiftkv_py_buffer(tokens, &view, 0, 4, "lookup")) return NULL;
  const char *fmt = view.format == NULL ? "B" : view.format;
  if (fmt[0] == '<' || fmt[0] == '=' || fmt[0] == '@') ++fmt;
  if (strcmp(fmt, "I") != 0) { /* 4-byte items that are not uint32 (int32, float) */
    PyBuffer_Release(&view);
    PyErr_SetString(PyExc_TypeError, "lookup: tokens must be uint32");
    return NULL;
  }
  const size_t n_tokens = (size_t)(view.len / 4);
  const size_t chunks = chunk_tokens == 0 ? 0 : n_tokens / chunk_tokens;
  PyObject *residency = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)chunks);
  if (residency == NULL) {
    PyBuffer_Release(&view);
    return NULL;
  }
  swiftkv_lookup_result r = SWIFTKV_LOOKUP_RESULT_INIT;
  swiftkv_status st;
  Py_BEGIN_ALLOW_THREADS
  st = swiftkv_lookup(&r, (uint8_t *)PyByteArray_AS_STRING(residency), chunks, ctx, model,
                      (const uint32_t *)view.buf, n_tokens);
  Py_END_ALLOW_THREADS
  PyBuffer_Release(&view);
  if (!swiftkv_py_check(st)) {
    Py_DECREF(residency);
    return NULL;
  }
  return Py_BuildValue("(KKKK(KKK)KN)", (unsigned long long)r.chunks,
                       (unsigned long long)r.prefix_tokens,
                       (unsigned long long)r.dropped_head_tokens,
                       (unsigned long long)r.loadable_tokens,
                       (unsigned long long)r.chunks_per_tier[0],
                       (unsigned long long)r.chunks_per_tier[1],
                       (unsigned long long)r.chunks_per_tier[2],
                       (unsigned long long)r.remote_chunks, residency);
}

/* The package's exception classes: `base` for every failure, `by_status` (a dict from status
 * to a subclass of base) for the statuses it names. Called once when swiftkv is imported. */
PyObject *swiftkv_py_set_error_classes(PyObject *base, PyObject *by_status) {
  if (!PyType_Check(base) || !PyDict_Check(by_status)) {
    PyErr_SetString(PyExc_TypeError, "expected an exception class and a dict");
    return NULL;
  }
  Py_INCREF(base);
  Py_INCREF(by_status);
  Py_XSETREF(swiftkv_py_error, base);
  Py_XSETREF(swiftkv_py_error_classes, by_status);
  Py_RETURN_NONE;
}
%}

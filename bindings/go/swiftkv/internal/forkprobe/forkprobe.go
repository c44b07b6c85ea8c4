// Package forkprobe forks from C, for the binding's tests: a Go program cannot fork itself
// (the runtime only forks to exec), but C code it links can, and the child then holds the
// parent's contexts. The child runs C only and reports by its exit code.
package forkprobe

/*
#cgo pkg-config: swiftkv
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "swiftkv/swiftkv.h"

static int refused_as_forked(swiftkv_status st) {
  return st == SWIFTKV_ESTATE && strstr(swiftkv_last_error_message(), "a fork of it") != NULL;
}

// In the child: a store of `n` tokens through the parent's context, a retrieve of them, and
// the context's destroy. Exit codes: 0 all refused and destroy returned, 10 the store, 11 the
// retrieve, 12 the destroy's message.
static int probe(void *raw, uint32_t model, const uint32_t *tokens, uint64_t n, const void *kv,
                 uint64_t kv_bytes, void *out) {
  swiftkv_ctx *ctx = (swiftkv_ctx *)raw;
  const pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    uint64_t got = 0;
    if (!refused_as_forked(swiftkv_store(&got, ctx, model, tokens, n, kv, kv_bytes))) _exit(10);
    if (!refused_as_forked(swiftkv_retrieve(&got, ctx, model, tokens, n, 0, out, kv_bytes)))
      _exit(11);
    swiftkv_ctx_destroy(ctx);
    _exit(strstr(swiftkv_last_error_message(), "a fork of it") != NULL ? 0 : 12);
  }
  int status = 0;
  if (waitpid(pid, &status, 0) != pid) return -2;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}
*/
import "C"

import "unsafe"

// StoreInChild forks; the child stores tokens and kv through the context at ctx (a
// *swiftkv_ctx) and model, retrieves them, destroys the context and exits. The child's exit
// status comes back: 0 when every call was refused as made in a fork.
func StoreInChild(ctx unsafe.Pointer, model uint32, tokens []uint32, kv []byte) int {
	t := C.malloc(C.size_t(4 * len(tokens)))
	defer C.free(t)
	copy(unsafe.Slice((*uint32)(t), len(tokens)), tokens)
	b := C.malloc(C.size_t(len(kv)))
	defer C.free(b)
	copy(unsafe.Slice((*byte)(b), len(kv)), kv)
	out := C.malloc(C.size_t(len(kv)))
	defer C.free(out)
	return int(C.probe(ctx, C.uint32_t(model), (*C.uint32_t)(t), C.uint64_t(len(tokens)), b,
		C.uint64_t(len(kv)), out))
}

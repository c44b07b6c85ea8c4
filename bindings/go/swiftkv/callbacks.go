package swiftkv

// The chunk event callback's way back into Go: the C library calls swiftkvGoChunkEvent with the
// cgo.Handle of the Go function as its user data. (A file with //export may only declare C.)

/*
#include "swiftkv/swiftkv.h"
*/
import "C"

import (
	"runtime/cgo"
	"unsafe"
)

//export swiftkvGoChunkEvent
func swiftkvGoChunkEvent(e *C.swiftkv_chunk_event, user unsafe.Pointer) {
	f := cgo.Handle(user).Value().(func(ChunkEvent))
	f(ChunkEvent{Model: uint32(e.model), From: Tier(e.from), To: Tier(e.to), Reason: uint32(e.reason),
		KeyLo: uint64(e.key_lo), KeyHi: uint64(e.key_hi)})
}

"""Reading an engine's tensors: address, dtype, shape, strides and device from any object that
offers one of the array protocols, so that torch (CPU and CUDA), numpy and cupy arrays pass
wherever the library takes memory.

Protocols, in the order they are tried:
  ``__cuda_array_interface__``  device memory (cupy, torch CUDA tensors, numba)
  ``__array_interface__``       host memory (numpy)
  ``__dlpack__``                torch CPU and CUDA tensors, jax, cupy; read in place: the
                                capsule is not consumed, the object keeps the memory
  the buffer protocol           bytes, bytearray, memoryview, array.array
An ``int`` is an address with nothing else known. The object must outlive every use the library
makes of its memory (a pool's tensors: as long as the pool).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Optional

import numpy as np

from . import capi as _c

HOST = -1  # the device of host memory (swiftkv.DEVICE_HOST)

__all__ = ["TensorInfo", "tensor_info", "stream_handle", "HOST"]


@dataclass(frozen=True)
class TensorInfo:
    """What the library needs to know of an array: strides are in elements."""

    address: int
    shape: tuple
    strides: tuple       # elements; C order when the object gave none
    itemsize: int        # bytes of one element
    kind: str            # 'f' float, 'bf' bfloat16, 'i' signed, 'u' unsigned, 'fp8' float8
    device: int          # HOST, or the CUDA device ordinal
    readonly: bool = False

    @property
    def nbytes(self) -> int:
        n = self.itemsize
        for d in self.shape:
            n *= d
        return n

    @property
    def span_bytes(self) -> int:
        """Bytes from the address to one past the farthest element the strides reach."""
        if any(d == 0 for d in self.shape):
            return 0
        last = sum((d - 1) * s for d, s in zip(self.shape, self.strides))
        return (last + 1) * self.itemsize

    @property
    def c_contiguous(self) -> bool:
        expect = 1
        for d, s in zip(reversed(self.shape), reversed(self.strides)):
            if d != 1 and s != expect:
                return False
            expect *= d
        return True


def _c_strides(shape) -> tuple:
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc *= d
    return tuple(reversed(out))


def _from_typestr(typestr: str):
    """(itemsize, kind) of an array-interface type string such as '<f2' or '|u1'."""
    kind, size = typestr[1], int(typestr[2:])
    if typestr[0] == ">" and size > 1:
        raise TypeError(f"big-endian arrays ({typestr!r}) are not supported")
    if kind == "V" and size == 2:  # bfloat16 as numpy extensions (ml_dtypes) describe it
        return 2, "bf"
    if kind not in "fiub":
        raise TypeError(f"unsupported element type {typestr!r}")
    return size, {"b": "u"}.get(kind, kind)


def _from_interface(iface: dict, device: int) -> TensorInfo:
    shape = tuple(int(d) for d in iface["shape"])
    itemsize, kind = _from_typestr(iface["typestr"])
    strides = iface.get("strides")
    if strides is None:
        strides = _c_strides(shape)
    else:
        if any(s % itemsize for s in strides):
            raise TypeError("strides that are not a multiple of the element size")
        strides = tuple(int(s) // itemsize for s in strides)
    data = iface.get("data")
    if not isinstance(data, tuple):
        raise TypeError("an array interface without a (pointer, read-only) data pair")
    return TensorInfo(int(data[0]), shape, strides, itemsize, kind, device, bool(data[1]))


# --- DLPack (read in place through ctypes) -------------------------------------------------------

class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


_kDLCPU, _kDLCUDA, _kDLCUDAHost, _kDLCUDAManaged = 1, 2, 3, 13
_DL_KIND = {0: "i", 1: "u", 2: "f", 4: "bf"}
_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


def _from_dlpack(obj) -> TensorInfo:
    try:
        capsule = obj.__dlpack__()
    except (TypeError, RuntimeError, BufferError) as e:
        raise TypeError(f"the object's __dlpack__ failed: {e}") from e
    # The capsule holds a DLManagedTensor whose first member is the DLTensor. It is read and
    # dropped unconsumed: its destructor gives the reference back, the object keeps the memory.
    t = _DLTensor.from_address(_capsule_pointer(capsule, b"dltensor"))
    if t.dtype.lanes != 1:
        raise TypeError("vector element types are not supported")
    kind = _DL_KIND.get(t.dtype.code)
    if kind is None or t.dtype.bits % 8:
        raise TypeError(f"unsupported DLPack element type (code {t.dtype.code}, "
                        f"{t.dtype.bits} bits)")
    itemsize = t.dtype.bits // 8
    shape = tuple(t.shape[i] for i in range(t.ndim))
    strides = (tuple(t.strides[i] for i in range(t.ndim)) if t.strides
               else _c_strides(shape))
    if t.device.device_type in (_kDLCPU, _kDLCUDAHost):
        device = HOST
    elif t.device.device_type in (_kDLCUDA, _kDLCUDAManaged):
        device = int(t.device.device_id)
    else:
        raise TypeError(f"memory of DLPack device type {t.device.device_type} is neither host "
                        "nor CUDA memory")
    info = TensorInfo(int(t.data or 0) + int(t.byte_offset), shape, strides, itemsize, kind,
                      device)
    del t
    del capsule
    return info


def _cuda_device_of(obj) -> int:
    dev = getattr(obj, "device", None)
    index = getattr(dev, "index", None)  # torch.device
    if index is None:
        index = getattr(dev, "id", None)  # cupy.cuda.Device
    if index is None:
        index = 0 if dev is None else int(dev)
    return int(index)


def tensor_info(obj) -> TensorInfo:
    """The address, shape, strides, element type and device of obj (see the module's text).

    Raises TypeError for an object that is no array at all."""
    if isinstance(obj, TensorInfo):
        return obj
    if isinstance(obj, int):
        return TensorInfo(obj, (), (), 1, "u", HOST)
    if getattr(obj, "requires_grad", False) and hasattr(obj, "detach"):
        obj = obj.detach()  # the same memory; torch exports no tensor that autograd tracks
    iface = getattr(obj, "__cuda_array_interface__", None)
    if iface is not None:
        return _from_interface(iface, _cuda_device_of(obj))
    iface = getattr(obj, "__array_interface__", None)
    if iface is not None:
        return _from_interface(iface, HOST)
    if hasattr(obj, "__dlpack__"):
        return _from_dlpack(obj)
    try:
        view = memoryview(obj)
    except TypeError:
        raise TypeError(f"{type(obj).__name__} is not an array: expected an object with "
                        "__cuda_array_interface__, __array_interface__, __dlpack__ or the "
                        "buffer protocol, or an int address") from None
    with view:
        itemsize = view.itemsize
        shape = tuple(view.shape) if view.ndim else (view.nbytes // itemsize,)
        strides = tuple(s // itemsize for s in view.strides) if view.ndim else (1,)
        fmt = view.format.lstrip("@=<")
        kind = "f" if fmt in ("e", "f", "d") else ("i" if fmt.islower() else "u")
        address = _c.swiftkv_py_address(obj)
        return TensorInfo(address, shape, strides, itemsize, kind, HOST, view.readonly)


def host_array(obj, *, writable: bool, what: str):
    """obj as something the SWIG layer takes as a host buffer: obj itself when it offers the
    buffer protocol, else a numpy view of its memory (torch CPU tensors). A device tensor, or
    one that is not C-contiguous, is refused with a message that says so."""
    try:
        memoryview(obj).release()
        return obj
    except TypeError:
        pass
    t = tensor_info(obj)
    if t.device != HOST:
        raise TypeError(f"{what}: the tensor is in CUDA memory (device {t.device}); this call "
                        "reads and writes host memory")
    if not t.c_contiguous:
        raise TypeError(f"{what}: the tensor is not C-contiguous")
    if writable and t.readonly:
        raise TypeError(f"{what}: the tensor is read-only")
    if t.nbytes == 0:
        return np.zeros(0, np.uint8)
    return np.ctypeslib.as_array((ctypes.c_uint8 * t.nbytes).from_address(t.address))


def stream_handle(stream) -> Optional[int]:
    """A CUDA stream as the int handle the library takes: None (the legacy default stream), an
    int, a torch.cuda.Stream (.cuda_stream) or a cupy Stream (.ptr)."""
    if stream is None or isinstance(stream, int):
        return stream
    for attr in ("cuda_stream", "ptr", "handle"):
        h = getattr(stream, attr, None)
        if isinstance(h, int):
            return h
    raise TypeError(f"{type(stream).__name__} is not a CUDA stream (expected an int, a "
                    "torch.cuda.Stream or a cupy Stream)")

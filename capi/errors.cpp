// Status strings, the thread-local last-error message, and the mapping of exceptions to
// statuses used by SWIFTKV_CATCH_ALL.
#include <exception>
#include <new>
#include <string>

#include "capi/capi_guard.hpp"
#include "capi/raw_enum.hpp"
#include "core/common/error.hpp"

namespace {

// One per thread: a failure on one thread never changes another thread's message.
thread_local std::string t_last_error;

}  // namespace

namespace swiftkv::capi {

swiftkv_status set_error(const char *function, swiftkv_status status, const std::string &message) {
  try {
    t_last_error.assign(function).append(": ").append(message);
  } catch (...) {
    // Out of memory while recording an error: keep the status, lose the text.
    t_last_error.clear();
  }
  return status;
}

swiftkv_status translate_current_exception(const char *function) noexcept {
  try {
    throw;
  } catch (const Error &e) {
    return set_error(function, e.status(), e.what());
  } catch (const std::bad_alloc &) {
    return set_error(function, SWIFTKV_ENOMEM, "out of host memory");
  } catch (const std::exception &e) {
    return set_error(function, SWIFTKV_EINTERNAL, std::string("unexpected exception: ") + e.what());
  } catch (...) {
    return set_error(function, SWIFTKV_EINTERNAL, "unexpected exception of unknown type");
  }
}

}  // namespace swiftkv::capi

extern "C" {

SWIFTKV_API const char *swiftkv_status_string(swiftkv_status status) {
  switch (swiftkv::capi::raw_enum_value(status)) {
    case SWIFTKV_OK: return "SWIFTKV_OK: success";
    case SWIFTKV_IN_PROGRESS: return "SWIFTKV_IN_PROGRESS: accepted and still running";
    case SWIFTKV_EINVAL: return "SWIFTKV_EINVAL: invalid argument";
    case SWIFTKV_ENOMEM: return "SWIFTKV_ENOMEM: out of memory or over budget";
    case SWIFTKV_ENOTFOUND: return "SWIFTKV_ENOTFOUND: no such object";
    case SWIFTKV_EBUSY: return "SWIFTKV_EBUSY: object in use";
    case SWIFTKV_EIO: return "SWIFTKV_EIO: I/O error or failed checksum";
    case SWIFTKV_ECUDA: return "SWIFTKV_ECUDA: CUDA error";
    case SWIFTKV_ENODEV: return "SWIFTKV_ENODEV: no usable GPU for this call";
    case SWIFTKV_EPEER: return "SWIFTKV_EPEER: peer process failed or broke the protocol";
    case SWIFTKV_ETIMEDOUT: return "SWIFTKV_ETIMEDOUT: timed out";
    case SWIFTKV_EVERSION: return "SWIFTKV_EVERSION: unknown struct or protocol version";
    case SWIFTKV_EUNSUPPORTED:
      return "SWIFTKV_EUNSUPPORTED: not supported by this build or machine";
    case SWIFTKV_EUSER: return "SWIFTKV_EUSER: a caller's callback failed";
    case SWIFTKV_ESTATE: return "SWIFTKV_ESTATE: not allowed in the current state";
    case SWIFTKV_EINTERNAL: return "SWIFTKV_EINTERNAL: internal error in libswiftkv";
  }
  return "unknown swiftkv_status";
}

SWIFTKV_API const char *swiftkv_last_error_message(void) { return t_last_error.c_str(); }

}  // extern "C"

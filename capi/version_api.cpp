// The run-time version of the library, from the same macros the header gives at compile time.
#include "swiftkv/swiftkv.h"

#define SWIFTKV_STR2(x) #x
#define SWIFTKV_STR(x) SWIFTKV_STR2(x)

extern "C" {

SWIFTKV_API uint32_t swiftkv_version(void) { return SWIFTKV_VERSION_NUMBER; }

SWIFTKV_API const char *swiftkv_version_string(void) {
  return SWIFTKV_STR(SWIFTKV_VERSION_MAJOR) "." SWIFTKV_STR(SWIFTKV_VERSION_MINOR) "." SWIFTKV_STR(
      SWIFTKV_VERSION_PATCH);
}

}  // extern "C"

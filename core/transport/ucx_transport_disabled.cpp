// The transport in a build without UCX: everything says SWIFTKV_EUNSUPPORTED.
#include "core/common/error.hpp"
#include "core/transport/ucx_transport.hpp"

namespace swiftkv::transport {

bool ucx_built() noexcept { return false; }

std::shared_ptr<UcxContext> UcxContext::create(const UcxOptions &) {
  fail(SWIFTKV_EUNSUPPORTED,
       "this build of libswiftkv has no UCX (install libucx-dev and "
       "rebuild): lending across nodes is unavailable");
}

}  // namespace swiftkv::transport

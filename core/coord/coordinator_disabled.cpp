// The coordinator of a build without ZeroMQ: a context still works in one process, and every
// call that needs another process says SWIFTKV_EUNSUPPORTED.
#include "core/coord/coordinator.hpp"

#include "core/common/error.hpp"

namespace swiftkv::coord {

namespace {

[[noreturn]] void unsupported() {
  fail(SWIFTKV_EUNSUPPORTED,
       "this libswiftkv was built without ZeroMQ (SWIFTKV_WITH_ZMQ=OFF): no coordinator");
}

}  // namespace

struct Coordinator::State {
  CoordOptions options;
};

Coordinator::Coordinator(CoordOptions options) : s_(std::make_shared<State>()) {
  if (options.endpoint) {
    const std::string &ep = *options.endpoint;
    if (ep.rfind("ipc://", 0) != 0 && ep.rfind("tcp://", 0) != 0) {
      fail_invalid("coord_endpoint \"" + ep + "\" is neither ipc:// nor tcp://");
    }
    unsupported();
  }
  s_->options = std::move(options);
}

Coordinator::~Coordinator() = default;

void Coordinator::shutdown() noexcept {}

void Coordinator::offer(const std::string &, const std::shared_ptr<ElasticRegion> &) {
  unsupported();
}

void Coordinator::withdraw(const ElasticRegion *) noexcept {}

std::shared_ptr<LenderLink> Coordinator::connect(const std::string &, const std::string &,
                                                 const ModelGeometry &, std::function<void()>) {
  unsupported();
}

CoordStats Coordinator::stats() const { return {}; }

const CoordOptions &Coordinator::options() const noexcept { return s_->options; }

}  // namespace swiftkv::coord

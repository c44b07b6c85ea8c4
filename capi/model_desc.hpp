// Conversion of the public model descriptor into the core's ModelGeometry, shared by every entry
// point that takes a swiftkv_model_desc.
#pragma once

#include <string>

#include "core/geometry/model_geometry.hpp"
#include "swiftkv/swiftkv.h"

namespace swiftkv::capi {

// Checks size/version, applies defaults for missing fields, validates the geometry (throws Error
// naming `arg`) and returns it with its sizes.
struct CheckedModel {
  ModelGeometry geometry;
  GeometrySizes sizes;
  std::string identity;  // "" when the caller gave none (or is version 1)
};
CheckedModel read_model_desc(const swiftkv_model_desc *desc, const char *arg);

}  // namespace swiftkv::capi

// The CPU twin of the paged attention kernels: the same work list and merges, accumulated in
// fp64. The host backend runs it, and the GPU tests compare the kernels against it.
#pragma once

#include <cstdint>

#include "core/attention/attention_plan.hpp"
#include "kernels/attention_work.h"

namespace swiftkv {

// EINVAL naming the entry when a page id a work item reads is outside [0, p.num_pages); reads
// nothing else, writes nothing.
void check_attention_pages(const AttentionParams &p);

// Computes every work item, then every merge, writing out, lse and the partial rows.
void run_attention_cpu(const AttentionShape &shape, const AttentionParams &p);

}  // namespace swiftkv

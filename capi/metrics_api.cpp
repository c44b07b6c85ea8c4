// The context's counters in Prometheus' text exposition format (version 0.0.4): one family per
// counter or gauge, with HELP and TYPE lines, per-tier values labelled
// tier="peer|host|disk|remote". Built from the same snapshots swiftkv_stats_get and
// swiftkv_coord_stats_get return.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

#include "capi/capi_guard.hpp"
#include "swiftkv/swiftkv.h"

namespace {

constexpr const char *kTierNames[4] = {"peer", "host", "disk", "remote"};

class Exposition {
 public:
  // One family of four per-tier values: the public array's three, then the remote tier's.
  void tiers(const char *name, const char *type, const char *help, const uint64_t (&v)[3],
             uint64_t remote) {
    header(name, type, help);
    for (size_t t = 0; t < 4; ++t) {
      text_ += std::string(name) + "{tier=\"" + kTierNames[t] + "\"} " +
               std::to_string(t < 3 ? v[t] : remote) + "\n";
    }
  }
  // One family of one value.
  void one(const char *name, const char *type, const char *help, uint64_t v) {
    header(name, type, help);
    text_ += std::string(name) + " " + std::to_string(v) + "\n";
  }
  // A counter of nanoseconds, exposed in seconds (Prometheus' base unit).
  void seconds(const char *name, const char *help, uint64_t ns) {
    header(name, "counter", help);
    char v[48];
    std::snprintf(v, sizeof v, "%llu.%09llu", static_cast<unsigned long long>(ns / 1'000'000'000),
                  static_cast<unsigned long long>(ns % 1'000'000'000));
    text_ += std::string(name) + " " + v + "\n";
  }
  const std::string &text() const { return text_; }

 private:
  void header(const char *name, const char *type, const char *help) {
    text_ += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
  }
  std::string text_;
};

}  // namespace

extern "C" {

SWIFTKV_API swiftkv_status swiftkv_metrics_text(char *buf, size_t capacity, size_t *length_out,
                                                const swiftkv_ctx *ctx) {
  try {
    swiftkv::capi::require(length_out, "length_out");
    swiftkv::capi::require(ctx, "ctx");
    if (buf == nullptr && capacity != 0) swiftkv::fail_invalid("buf is NULL but capacity is not 0");
    swiftkv_stats s = SWIFTKV_STATS_INIT;
    swiftkv_coord_stats c = SWIFTKV_COORD_STATS_INIT;
    if (swiftkv_stats_get(&s, ctx) != SWIFTKV_OK) swiftkv::fail(SWIFTKV_EINTERNAL, "stats");
    if (swiftkv_coord_stats_get(&c, ctx) != SWIFTKV_OK) {
      swiftkv::fail(SWIFTKV_EINTERNAL, "coordinator stats");
    }
    Exposition e;
    e.tiers("swiftkv_chunks", "gauge", "Chunks resident in the tier.", s.chunks, s.remote_chunks);
    e.tiers("swiftkv_tier_bytes", "gauge", "Bytes of the chunks resident in the tier.", s.bytes,
            s.remote_bytes);
    e.tiers("swiftkv_tier_capacity_bytes", "gauge",
            "Bytes the tier may hold: lent memory held, the host budget, the disk budget.",
            s.capacity_bytes, s.remote_capacity_bytes);
    e.tiers("swiftkv_lookup_hits_total", "counter", "Chunks a lookup found in the tier.", s.hits,
            s.remote_hits);
    e.one("swiftkv_lookup_misses_total", "counter", "Chunks a lookup did not find.", s.misses);
    e.one("swiftkv_stores_total", "counter", "Chunks stored.", s.stores);
    e.one("swiftkv_stores_rejected_total", "counter", "Chunks no tier had room for.",
          s.stores_rejected);
    e.one("swiftkv_evictions_total", "counter", "Chunks dropped by the eviction policy.",
          s.evictions);
    e.one("swiftkv_demotions_total", "counter", "Chunks moved down a tier.", s.demotions);
    e.one("swiftkv_promotions_total", "counter", "Chunks moved up a tier.", s.promotions);
    e.one("swiftkv_load_failures_total", "counter",
          "Chunks that failed their check or could not be read.", s.load_failures);
    e.one("swiftkv_revocations_total", "counter",
          "Chunks that left lent memory because the lender took it back.", s.revocations);
    e.one("swiftkv_demotions_deferred_total", "counter",
          "Background demotions that let a pending load go first.", s.demotions_deferred);
    e.one("swiftkv_disk_records_removed_total", "counter",
          "Disk records dropped at start-up (torn, failing a check, superseded, over budget).",
          s.corrupt_files_removed);
    e.one("swiftkv_disk_files_skipped_total", "counter",
          "Entries of the disk path left alone at start-up.", s.disk_files_skipped);
    e.one("swiftkv_disk_records_mismatched_total", "counter",
          "Disk reads that found another record than the chunk.", s.disk_records_mismatched);
    e.one("swiftkv_disk_segments_cleaned_total", "counter", "Disk segments emptied for reuse.",
          s.disk_segments_cleaned);
    e.one("swiftkv_disk_relocated_bytes_total", "counter",
          "Record bytes copied by segment cleaning.", s.disk_bytes_relocated);
    e.one("swiftkv_disk_allocated_bytes", "gauge", "Bytes of segment files on disk.",
          s.disk_bytes_allocated);
    e.one("swiftkv_disk_full_refusals_total", "counter",
          "Disk segments the filesystem could not give (a full disk).", s.disk_full_refusals);
    e.one("swiftkv_index_bytes", "gauge", "Host memory of the chunk index.", s.index_bytes);
    e.one("swiftkv_index_capacity_chunks", "gauge",
          "Resident chunks the index holds before it grows.", s.index_capacity_chunks);
    e.one("swiftkv_requests_open", "gauge", "Connector requests begun and not finished.",
          s.requests_open);
    e.one("swiftkv_coord_offered_regions", "gauge", "Elastic regions this context offers.",
          c.offered_regions);
    e.one("swiftkv_coord_sessions", "gauge", "Borrower sessions on the offered regions.",
          c.sessions_served);
    e.one("swiftkv_coord_lenders_connected", "gauge", "Remote lenders this context borrows from.",
          c.lenders_connected);
    e.one("swiftkv_coord_messages_sent_total", "counter", "Coordinator messages sent.",
          c.messages_sent);
    e.one("swiftkv_coord_messages_received_total", "counter", "Coordinator messages received.",
          c.messages_received);
    e.one("swiftkv_coord_messages_dropped_total", "counter",
          "Coordinator messages dropped: malformed, unexpected, duplicated or reordered.",
          c.messages_dropped);
    e.one("swiftkv_coord_reclaims_sent_total", "counter",
          "Leases asked back from remote borrowers.", c.reclaims_sent);
    e.one("swiftkv_coord_reclaims_acked_total", "counter", "Leases asked back and given back.",
          c.reclaims_acked);
    e.seconds("swiftkv_coord_reclaim_seconds_total",
              "Time from asking a lease back to its release, summed over acked reclaims.",
              c.reclaim_ns_total);
    e.one("swiftkv_coord_leases_lost_total", "counter",
          "Borrowed leases lost to expiry or a dead lender.", c.leases_lost);
    e.one("swiftkv_coord_lenders_lost_total", "counter", "Lenders that went away.", c.lenders_lost);
    e.one("swiftkv_coord_remote_sessions", "gauge",
          "Borrower sessions on the offered regions reached over UCX.", c.remote_sessions);
    e.one("swiftkv_coord_remote_lenders", "gauge", "Remote lenders reached over UCX.",
          c.remote_lenders);
    e.one("swiftkv_coord_grants_refused_total", "counter",
          "Grants this side could not use (a forged key, a range outside the region), given back.",
          c.grants_refused);
    e.one("swiftkv_coord_rma_batches_total", "counter",
          "Batches of UCX reads and writes of lent memory.", c.rma_batches);
    e.one("swiftkv_coord_rma_batches_failed_total", "counter",
          "Batches of UCX reads and writes that failed; none of their bytes were used.",
          c.rma_batches_failed);
    e.one("swiftkv_coord_rma_read_bytes_total", "counter", "Lent bytes read over UCX.",
          c.rma_bytes_read);
    e.one("swiftkv_coord_rma_written_bytes_total", "counter", "Lent bytes written over UCX.",
          c.rma_bytes_written);
    const std::string &text = e.text();
    *length_out = text.size();
    if (capacity > text.size()) std::memcpy(buf, text.c_str(), text.size() + 1);
    return SWIFTKV_OK;
  }
  SWIFTKV_CATCH_ALL
}

}  // extern "C"

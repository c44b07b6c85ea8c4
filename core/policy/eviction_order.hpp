// The order in which full tiers give chunks up, kept up to date as chunks are stored, touched,
// pinned and moved, so that finding a victim never scans the index: LRU exactly, Pensieve's
// retention value within a factor of 2^(1/4) of the exact order.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "core/index/chunk_key.hpp"
#include "core/memory/large_pages.hpp"
#include "core/policy/eviction_policy.hpp"

namespace swiftkv {

// Not thread-safe: its owner (ChunkIndex) serialises every call under one lock.
//
// Every resident chunk has a node: its last activity, its key, its cost class and its place in
// one container of its domain. A domain is what one full tier chooses its victim from: the host
// tier, the disk tier, or one model's chunks in lent memory. Within a domain, nodes are grouped
// by cost class (one class under LRU; under retention, classes of recompute cost a factor
// 2^(1/4) apart), and within a class kept by last activity in a few FIFO lists, each of which
// never gets older from head to tail, and an ordered tree for a node that fits no list's tail.
// A touch makes a node the newest of its class: O(1). A node linked again with an older time
// (unpinned, moved by hand, evacuated from lent memory, demoted out of order) goes to the list
// whose tail it follows most closely, or to the tree (O(log n)); a demotion that follows the
// order of the tier above (the usual case) always finds a list.
//
// The victim of a domain:
//  - LRU: the node whose last activity is the oldest, exactly (ties: any of them).
//  - Retention: the class that minimises class_cost / (now - its oldest activity), and that
//    class's oldest node. Chunk i's retention value is v_i = cost_i / (now - last_active_i);
//    class_cost is the lower bound of the class's costs, and a class spans a factor
//    r = 2^(1/4). Let i* hold the smallest value v* in the domain, in class c*, whose oldest
//    node is h*. Then the victim h, in class c, has
//        v_h < r * class_cost_c / idle_h <= r * class_cost_c* / idle_h* <= r * v*,
//    so the victim's value is below 2^(1/4) ~ 1.19 times the smallest. Costs are clamped into
//    [2^-32, 2^32) for the classes (costs of 0 form a class of their own, evicted first).
class EvictionOrder {
 public:
  static constexpr uint32_t kNoNode = UINT32_MAX;
  static constexpr uint32_t kClasses = 256;                     // retention cost classes
  static constexpr int kClassesPerOctave = 4;                   // r = 2^(1/4)
  static constexpr double kRetentionBound = 1.189207115002721;  // 2^(1/4)

  EvictionOrder(EvictionPolicy policy, RecomputeCost cost);
  ~EvictionOrder();
  EvictionOrder(const EvictionOrder &) = delete;
  EvictionOrder &operator=(const EvictionOrder &) = delete;

  EvictionPolicy policy() const noexcept { return policy_; }
  // Room for `nodes` nodes without reallocation.
  void reserve(uint64_t nodes);
  // Bytes of memory the order holds: its nodes (40 bytes each, as reserved), its domains' class
  // tables and its tree entries.
  uint64_t memory_bytes() const noexcept;
  // The bytes that room for `nodes` nodes takes (from 2 MiB on, on huge pages: whole pages).
  static uint64_t node_bytes(uint64_t nodes) noexcept { return large_bytes(nodes * sizeof(Node)); }

  // A node for the chunk `key` of `tokens` tokens at chunk number `position` of its sequence,
  // last active at `now`, in no domain yet, whose tier holds `stored_bytes` of it (0: not said),
  // with `hits` touches so far (a chunk's node made again keeps its history).
  uint32_t add(const ChunkKey &key, uint32_t position, uint32_t tokens, uint64_t now,
               uint64_t stored_bytes = 0, uint16_t hits = 0);
  // The chunk's tier now holds `stored_bytes` of it (re-encoded, moved).
  void set_stored(uint32_t node, uint64_t stored_bytes) noexcept {
    nodes_[node].stored = stored_code(stored_bytes);
  }
  // At least the bytes the node's chunk is stored in, so that a batch of victims can be taken
  // from the order before their slots are read without taking more than the bytes asked for:
  // exact to 64 bytes up to 256 KiB, within 1/2048 above; kUnknownStored when not said.
  static constexpr uint64_t kUnknownStored = uint64_t{1} << 62;
  uint64_t stored_bound(uint32_t node) const noexcept {
    const uint16_t c = nodes_[node].stored;
    if (c == 0) return kUnknownStored;
    return (uint64_t{c} & 0xfff) << (c >> 12) << 6;
  }
  static uint16_t stored_code(uint64_t bytes) noexcept;
  // Takes a node out of its domain and frees it.
  void remove(uint32_t node) noexcept;
  // Puts a node that is in no domain into `domain`, in its place by last activity.
  void link(uint32_t node, uint32_t domain);
  // Takes a node out of its domain (a pinned or moving chunk is nobody's victim).
  void unlink(uint32_t node) noexcept;
  bool linked(uint32_t node) const noexcept;
  // Activity at `now`: a node in a domain becomes the newest of its class there.
  void touch(uint32_t node, uint64_t now);
  // A node its owner found in use when it was the victim (a chunk being read): the newest of
  // its class, later than its last activity and no earlier than `now`. Not a touch: its hits
  // stay.
  void renew(uint32_t node, uint64_t now);
  // Hints for a run of touches: fetch a node, then the neighbours a touch of it will write.
  void prefetch(uint32_t node) const noexcept { __builtin_prefetch(&nodes_[node], 1, 1); }
  void prefetch_neighbours(uint32_t node) const noexcept {
    const Node &n = nodes_[node];
    if (n.prev != kNoNode) __builtin_prefetch(&nodes_[n.prev], 1, 1);
    if (n.next != kNoNode) __builtin_prefetch(&nodes_[n.next], 1, 1);
  }

  uint64_t last_active(uint32_t node) const noexcept { return nodes_[node].la; }
  // Touches since the node was added (saturating at 65535): its reuse history for the
  // compression policy.
  uint32_t hits(uint32_t node) const noexcept { return nodes_[node].hits; }
  const ChunkKey &key(uint32_t node) const noexcept { return nodes_[node].key; }
  // The node behind `node` in its FIFO list (kNoNode at the tail, in the tree or unlinked): the
  // likely victim after it, for prefetching.
  uint32_t next_in_list(uint32_t node) const noexcept {
    return nodes_[node].list < kLists ? nodes_[node].next : kNoNode;
  }
  // The retention class of a cost, and the lower bound of a class's costs.
  static uint32_t cost_class(double cost) noexcept;
  static double class_cost(uint32_t cls) noexcept;

  // The node `domain` gives up first at `now`; kNoNode when the domain holds none.
  uint32_t victim(uint32_t domain, uint64_t now) const;

 private:
  struct Domain;

 public:
  // Successive victims of one domain at one `now`, taken while nothing else changes the order
  // (a batch of evictions under the owner's lock), in the order victim() would give them: the
  // classes' oldest activities are read once, and then only the class a victim leaves.
  class Victims {
   public:
    Victims(EvictionOrder &order, uint32_t domain, uint64_t now);
    // The next victim; kNoNode when the domain holds none.
    uint32_t peek() const noexcept { return node_; }
    // Removes that node from the order (as remove()) and finds the next.
    void pop() noexcept;

   private:
    struct Candidate {
      double cost, idle;
      uint32_t cls;
      uint32_t node;
    };
    bool read(uint32_t cls, Candidate *out) const noexcept;
    void choose() noexcept;
    // Under LRU the victim is the one class's oldest: no candidates, no costs.
    uint32_t oldest_lru() const noexcept;

    EvictionOrder &order_;
    const Domain *dom_ = nullptr;
    uint64_t now_;
    std::vector<Candidate> candidates_;  // retention: one per nonempty class
    size_t chosen_ = 0;
    uint32_t node_ = kNoNode;
  };
  // Nodes in `domain`.
  uint64_t size(uint32_t domain) const noexcept;

 private:
  static constexpr uint8_t kLists = 2;
  static constexpr uint8_t kTree = 0xfd;
  static constexpr uint8_t kUnlinked = 0xfe;
  static constexpr uint8_t kFree = 0xff;

  struct Node {
    uint64_t la = 0;  // last activity
    ChunkKey key;
    uint32_t prev = kNoNode, next = kNoNode;  // in a FIFO list; next links the free list
    uint16_t domain = 0;
    uint8_t cls = 0;
    uint8_t list = kFree;  // 0..kLists-1, kTree, kUnlinked or kFree
    uint16_t hits = 0;     // touches at a later time than the last one (in the padding)
    uint16_t stored = 0;   // stored_bound: 12 bits of 64-byte units, times 2^(4 bits); 0 not said
  };
  static_assert(sizeof(Node) == 40);

  // Head and tail activities are kept here so that the retention scan reads no node.
  struct Fifo {
    uint32_t head = kNoNode, tail = kNoNode;
    uint64_t head_la = 0, tail_la = 0;
  };
  struct Class {
    std::array<Fifo, kLists> fifo;
    std::set<std::pair<uint64_t, uint32_t>> tree;  // (last activity, node)
    uint64_t size = 0;
    // The oldest activity in the class, and where it is (a FIFO's index or kTree).
    std::pair<uint64_t, uint8_t> oldest() const noexcept;
  };
  struct Domain {
    std::vector<Class> classes;
    std::array<uint64_t, kClasses / 64> nonempty{};  // a bit per class with nodes
    uint64_t size = 0;
  };

  Domain &domain(uint32_t d);
  void append(Fifo &f, uint32_t node, uint8_t list) noexcept;

  const EvictionPolicy policy_;
  const RecomputeCost cost_;
  // Victims are read in the order of their last activity, which is not the order of the nodes
  // in memory (under retention, each class's oldest in turn): on huge pages.
  std::vector<Node, LargePageAllocator<Node>> nodes_;
  // Where a chunk's node comes from, so that the walk along a class's oldest (its victims, one
  // after another) goes forward through memory, where the hardware fetches ahead of it:
  //  - Freed nodes, oldest first, one list per cost class (one under LRU): a class's victims
  //    leave in the order its chunks came, and the chunks that come next take their nodes in
  //    that order, so each class's list walks its nodes in the same order, generation after
  //    generation. (With one list for all classes, the classes' victims interleave as their
  //    values say, each generation in another order, and after a few the walk along a class's
  //    oldest is a cache miss a node.)
  //  - New nodes, in blocks of kBlockNodes per class: a store's chunks span several classes
  //    (the cost grows with the position), and nodes given in store order would put each class's
  //    next chunks a store's length further on, a miss at every jump.
  // A class with neither takes a new block from the room reserved, then a run of up to
  // kBorrowNodes of another class's freed nodes (moved to its own list: borrowed one at a time,
  // each would be a jump in its walk, and classes' shares move all the time), then the rest of
  // another class's block, and only then does the vector grow: the order never holds more nodes
  // than it has chunks while they fit the room reserved.
  static constexpr uint32_t kBlockNodes = 256;
  static constexpr uint32_t kBorrowNodes = 64;
  struct FreeList {
    uint32_t head = kNoNode, tail = kNoNode;
  };
  struct Block {
    uint32_t next = 0, end = 0;  // nodes [next, end) are the class's, never used yet
  };
  std::array<FreeList, kClasses> free_{};
  std::array<uint64_t, kClasses / 64> free_nonempty_{};  // a bit per class with free nodes
  std::array<Block, kClasses> blocks_{};
  // The first node of class cls's free list, which must have one.
  uint32_t take_free(uint32_t cls) noexcept;
  // The first class with free nodes; kClasses when none has.
  uint32_t first_free_class() const noexcept;
  // A node for a chunk of class cls, from where the comment above says; kNoNode when the vector
  // must grow.
  uint32_t take_node(uint32_t cls) noexcept;
  uint64_t tree_entries_ = 0;
  std::vector<std::unique_ptr<Domain>> domains_;
};

}  // namespace swiftkv

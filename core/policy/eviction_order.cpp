// Eviction order: FIFO lists by last activity per cost class and domain, a tree for what fits
// no list, and the victim scan over the classes' oldest activities.
#include "core/policy/eviction_order.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <stdexcept>

namespace swiftkv {

EvictionOrder::EvictionOrder(EvictionPolicy policy, RecomputeCost cost)
    : policy_(policy), cost_(std::move(cost)) {}

EvictionOrder::~EvictionOrder() = default;

void EvictionOrder::reserve(uint64_t nodes) {
  if (nodes > kNoNode) nodes = kNoNode;
  nodes_.reserve(nodes);
}

uint64_t EvictionOrder::memory_bytes() const noexcept {
  // A tree entry is a red-black tree node: three pointers, a colour and the pair, rounded to
  // the allocator's 16 bytes.
  constexpr uint64_t kTreeEntryBytes = 48;
  uint64_t n = node_bytes(nodes_.capacity()) + domains_.capacity() * sizeof(domains_[0]) +
               tree_entries_ * kTreeEntryBytes;
  for (const auto &d : domains_) {
    if (d) n += sizeof(Domain) + d->classes.capacity() * sizeof(Class);
  }
  return n;
}

uint32_t EvictionOrder::cost_class(double cost) noexcept {
  if (!(cost > 0)) return 0;  // free to recompute (or a cost model that says nothing)
  // The last class whose lower bound is at most the cost, told by the table of bounds itself
  // (so a cost is never below its class's bound, which the retention bound relies on), without
  // log2: a class is taken for every chunk stored, and log2 cost a full tier's store 6%.
  if (cost >= class_cost(kClasses - 1)) return kClasses - 1;  // infinity too
  if (cost < class_cost(2)) return 1;
  // A normal number here, in [2^e, 2^(e+1)): class 128 + 4e has the bound 2^e, and the cost is
  // in it or one of the three above it.
  const auto e = static_cast<int32_t>((std::bit_cast<uint64_t>(cost) >> 52) & 0x7ff) - 1023;
  uint32_t c = static_cast<uint32_t>(kClasses / 2 + kClassesPerOctave * e);
  while (c + 1 < kClasses && class_cost(c + 1) <= cost) ++c;
  return std::max<uint32_t>(c, 1);
}

double EvictionOrder::class_cost(uint32_t cls) noexcept {
  // A table: the retention scan asks it for every class at every victim.
  static const std::array<double, kClasses> table = [] {
    std::array<double, kClasses> t{};
    for (uint32_t c = 1; c < kClasses; ++c) {
      t[c] = std::exp2((static_cast<double>(c) - kClasses / 2) / kClassesPerOctave);
    }
    return t;
  }();
  return cls < kClasses ? table[cls]
                        : std::exp2((static_cast<double>(cls) - kClasses / 2) / kClassesPerOctave);
}

uint16_t EvictionOrder::stored_code(uint64_t bytes) noexcept {
  if (bytes == 0) return 0;
  uint64_t units = (bytes + 63) / 64;  // rounded up: the code is a bound from above
  uint32_t e = 0;
  if (units >= 4096) {
    e = static_cast<uint32_t>(std::bit_width(units)) - 12;
    units = (units + (uint64_t{1} << e) - 1) >> e;
    if (units == 4096) {
      units = 2048;
      ++e;
    }
  }
  if (e > 15) return 0;  // over 8 GiB: not said, which callers treat as more than any batch
  return static_cast<uint16_t>((e << 12) | units);
}

uint32_t EvictionOrder::take_node(uint32_t cls) noexcept {
  if (free_[cls].head != kNoNode) return take_free(cls);
  Block &b = blocks_[cls];
  if (b.next != b.end) return b.next++;
  const size_t room = std::min<size_t>(nodes_.capacity(), kNoNode) - nodes_.size();
  if (room != 0) {  // a new block: made in the room reserved, so no node moves
    const auto first = static_cast<uint32_t>(nodes_.size());
    const auto n = static_cast<uint32_t>(std::min<size_t>(kBlockNodes, room));
    nodes_.resize(nodes_.size() + n);
    b = Block{first + 1, first + n};
    return first;
  }
  // Another class's free nodes: a run of them moved to this class's list, so that this class's
  // next chunks take nodes that lie together. One borrowed at a time, each is a jump in the
  // class's walk, and under many classes (a long prompt's chunks span twenty) a store borrows
  // for most of them.
  const uint32_t donor = first_free_class();
  if (donor != kClasses) {
    FreeList &d = free_[donor];
    FreeList &f = free_[cls];
    uint32_t last = d.head;
    for (uint32_t i = 1; i < kBorrowNodes && nodes_[last].next != kNoNode; ++i) {
      last = nodes_[last].next;
    }
    f.head = d.head;
    f.tail = last;
    d.head = nodes_[last].next;
    nodes_[last].next = kNoNode;
    if (d.head == kNoNode) {
      d.tail = kNoNode;
      free_nonempty_[donor / 64] &= ~(uint64_t{1} << (donor % 64));
    }
    free_nonempty_[cls / 64] |= uint64_t{1} << (cls % 64);
    return take_free(cls);
  }
  for (Block &other : blocks_) {
    if (other.next != other.end) return other.next++;
  }
  return kNoNode;
}

uint32_t EvictionOrder::first_free_class() const noexcept {
  for (uint32_t w = 0; w < free_nonempty_.size(); ++w) {
    if (free_nonempty_[w] != 0) {
      return w * 64 + static_cast<uint32_t>(std::countr_zero(free_nonempty_[w]));
    }
  }
  return kClasses;
}

uint32_t EvictionOrder::take_free(uint32_t cls) noexcept {
  FreeList &f = free_[cls];
  const uint32_t id = f.head;
  f.head = nodes_[id].next;
  if (f.head == kNoNode) {
    f.tail = kNoNode;
    free_nonempty_[cls / 64] &= ~(uint64_t{1} << (cls % 64));
  }
  return id;
}

uint32_t EvictionOrder::add(const ChunkKey &key, uint32_t position, uint32_t tokens, uint64_t now,
                            uint64_t stored_bytes, uint16_t hits) {
  uint8_t cls = 0;
  if (policy_ == EvictionPolicy::retention) {
    const uint64_t s = tokens;
    cls = static_cast<uint8_t>(cost_class(cost_.chunk_cost(s, (uint64_t{position} + 1) * s)));
  }
  uint32_t id = take_node(cls);
  if (id == kNoNode) {
    if (nodes_.size() >= kNoNode) throw std::length_error("eviction order: too many chunks");
    id = static_cast<uint32_t>(nodes_.size());
    nodes_.emplace_back();
  }
  Node &n = nodes_[id];
  n.la = now;
  n.key = key;
  n.hits = hits;
  n.stored = stored_code(stored_bytes);
  n.prev = n.next = kNoNode;
  n.domain = 0;
  n.cls = cls;
  n.list = kUnlinked;
  return id;
}

void EvictionOrder::remove(uint32_t node) noexcept {
  unlink(node);
  Node &n = nodes_[node];
  // Freed nodes are reused first in, first out, by class: a full tier frees its victims in
  // order and stores as many chunks, so a FIFO list keeps its nodes in order of their numbers
  // and the victims to come lie ahead in memory (the walk along the oldest is sequential).
  n.list = kFree;
  n.next = kNoNode;
  FreeList &f = free_[n.cls];
  if (f.tail == kNoNode) {
    f.head = node;
    free_nonempty_[n.cls / 64] |= uint64_t{1} << (n.cls % 64);
  } else {
    nodes_[f.tail].next = node;
  }
  f.tail = node;
}

EvictionOrder::Domain &EvictionOrder::domain(uint32_t d) {
  if (d > UINT16_MAX) throw std::length_error("eviction order: too many domains");
  while (domains_.size() <= d) {
    auto dom = std::make_unique<Domain>();
    dom->classes.resize(policy_ == EvictionPolicy::retention ? kClasses : 1);
    domains_.push_back(std::move(dom));
  }
  return *domains_[d];
}

void EvictionOrder::append(Fifo &f, uint32_t node, uint8_t list) noexcept {
  Node &n = nodes_[node];
  n.prev = f.tail;
  n.next = kNoNode;
  n.list = list;
  if (f.tail != kNoNode) {
    nodes_[f.tail].next = node;
  } else {
    f.head = node;
    f.head_la = n.la;
  }
  f.tail = node;
  f.tail_la = n.la;
}

void EvictionOrder::link(uint32_t node, uint32_t d) {
  Domain &dom = domain(d);
  Node &n = nodes_[node];
  Class &c = dom.classes[n.cls];
  // The list whose tail is the newest that is not newer than the node keeps every list in
  // order and leaves the others for older arrivals; an empty list fits anything, last.
  int best = -1;
  uint64_t best_fit = 0;
  for (uint8_t i = 0; i < kLists; ++i) {
    const Fifo &f = c.fifo[i];
    uint64_t fit = 0;
    if (f.tail == kNoNode) {
      fit = 0;
    } else if (f.tail_la <= n.la) {
      fit = f.tail_la + 1;
    } else {
      continue;
    }
    if (best < 0 || fit > best_fit) {
      best = i;
      best_fit = fit;
    }
  }
  if (best >= 0) {
    append(c.fifo[static_cast<size_t>(best)], node, static_cast<uint8_t>(best));
  } else {
    c.tree.emplace(n.la, node);
    ++tree_entries_;
    n.list = kTree;
  }
  n.domain = static_cast<uint16_t>(d);
  if (c.size++ == 0) dom.nonempty[n.cls / 64] |= uint64_t{1} << (n.cls % 64);
  ++dom.size;
}

bool EvictionOrder::linked(uint32_t node) const noexcept {
  const uint8_t l = nodes_[node].list;
  return l < kLists || l == kTree;
}

void EvictionOrder::unlink(uint32_t node) noexcept {
  Node &n = nodes_[node];
  if (!linked(node)) return;
  Domain &dom = *domains_[n.domain];
  Class &c = dom.classes[n.cls];
  if (n.list == kTree) {
    c.tree.erase({n.la, node});
    --tree_entries_;
  } else {
    Fifo &f = c.fifo[n.list];
    if (n.prev != kNoNode) {
      nodes_[n.prev].next = n.next;
    } else {
      f.head = n.next;
      if (n.next != kNoNode) f.head_la = nodes_[n.next].la;
    }
    if (n.next != kNoNode) {
      nodes_[n.next].prev = n.prev;
    } else {
      f.tail = n.prev;
      if (n.prev != kNoNode) f.tail_la = nodes_[n.prev].la;
    }
  }
  n.prev = n.next = kNoNode;
  n.list = kUnlinked;
  if (--c.size == 0) dom.nonempty[n.cls / 64] &= ~(uint64_t{1} << (n.cls % 64));
  --dom.size;
}

void EvictionOrder::touch(uint32_t node, uint64_t now) {
  Node &n = nodes_[node];
  if (now <= n.la) return;  // no newer than what the order has
  if (n.hits != UINT16_MAX) ++n.hits;
  if (!linked(node)) {
    n.la = now;
    return;
  }
  if (n.list != kTree) {
    Fifo &f = domains_[n.domain]->classes[n.cls].fifo[n.list];
    if (f.tail == node) {  // already the newest of its list: it stays in order
      n.la = now;
      f.tail_la = now;
      if (f.head == node) f.head_la = now;
      return;
    }
  }
  const uint32_t d = n.domain;
  unlink(node);
  n.la = now;
  link(node, d);
}

void EvictionOrder::renew(uint32_t node, uint64_t now) {
  Node &n = nodes_[node];
  if (!linked(node)) return;
  const uint32_t d = n.domain;
  unlink(node);
  n.la = std::max(now, n.la + 1);
  link(node, d);
}

std::pair<uint64_t, uint8_t> EvictionOrder::Class::oldest() const noexcept {
  std::pair<uint64_t, uint8_t> best{UINT64_MAX, kUnlinked};
  for (uint8_t i = 0; i < kLists; ++i) {
    if (fifo[i].head != kNoNode && fifo[i].head_la < best.first) best = {fifo[i].head_la, i};
  }
  if (!tree.empty() && tree.begin()->first < best.first) best = {tree.begin()->first, kTree};
  return best;
}

uint32_t EvictionOrder::victim(uint32_t d, uint64_t now) const {
  if (d >= domains_.size()) return kNoNode;
  const Domain &dom = *domains_[d];
  if (dom.size == 0) return kNoNode;
  const Class *chosen = nullptr;
  std::pair<uint64_t, uint8_t> at{};
  if (policy_ == EvictionPolicy::lru) {
    chosen = &dom.classes[0];
    at = chosen->oldest();
  } else {
    // The smallest class_cost / idle, compared as cost_a * idle_b < cost_b * idle_a.
    double best_cost = 0;
    double best_idle = 0;
    for (uint32_t w = 0; w < dom.nonempty.size(); ++w) {
      for (uint64_t bits = dom.nonempty[w]; bits != 0; bits &= bits - 1) {
        const uint32_t cls = w * 64 + static_cast<uint32_t>(__builtin_ctzll(bits));
        const Class &c = dom.classes[cls];
        const auto o = c.oldest();
        const double idle = static_cast<double>(now > o.first ? now - o.first : 1);
        const double cost = class_cost(cls);
        if (chosen == nullptr || cost * best_idle < best_cost * idle) {
          chosen = &c;
          at = o;
          best_cost = cost;
          best_idle = idle;
        }
      }
    }
  }
  if (at.second == kTree) return chosen->tree.begin()->second;
  return chosen->fifo[at.second].head;
}

EvictionOrder::Victims::Victims(EvictionOrder &order, uint32_t d, uint64_t now)
    : order_(order), now_(now) {
  if (d >= order.domains_.size() || order.domains_[d]->size == 0) return;
  dom_ = order.domains_[d].get();
  if (order.policy_ == EvictionPolicy::lru) {
    node_ = oldest_lru();
    return;
  }
  for (uint32_t w = 0; w < dom_->nonempty.size(); ++w) {
    for (uint64_t bits = dom_->nonempty[w]; bits != 0; bits &= bits - 1) {
      Candidate c{};
      if (read(w * 64 + static_cast<uint32_t>(__builtin_ctzll(bits)), &c)) {
        candidates_.push_back(c);
      }
    }
  }
  choose();
}

bool EvictionOrder::Victims::read(uint32_t cls, Candidate *out) const noexcept {
  const Class &c = dom_->classes[cls];
  if (c.size == 0) return false;
  const auto o = c.oldest();
  out->cls = cls;
  out->cost = class_cost(cls);
  out->idle = static_cast<double>(now_ > o.first ? now_ - o.first : 1);
  out->node = o.second == kTree ? c.tree.begin()->second : c.fifo[o.second].head;
  order_.prefetch(out->node);  // its key is read if it becomes the victim
  return true;
}

void EvictionOrder::Victims::choose() noexcept {
  // As victim(): the smallest class_cost / idle, compared as cost_a * idle_b < cost_b * idle_a,
  // the first of equals in class order; under LRU the one class.
  node_ = kNoNode;
  for (size_t i = 0; i < candidates_.size(); ++i) {
    const Candidate &c = candidates_[i];
    if (node_ == kNoNode ||
        c.cost * candidates_[chosen_].idle < candidates_[chosen_].cost * c.idle) {
      chosen_ = i;
      node_ = c.node;
    }
  }
}

uint32_t EvictionOrder::Victims::oldest_lru() const noexcept {
  const Class &c = dom_->classes[0];
  if (c.size == 0) return kNoNode;
  const auto o = c.oldest();
  return o.second == kTree ? c.tree.begin()->second : c.fifo[o.second].head;
}

void EvictionOrder::Victims::pop() noexcept {
  if (node_ == kNoNode) return;
  order_.remove(node_);
  if (order_.policy_ == EvictionPolicy::lru) {
    node_ = oldest_lru();
    return;
  }
  Candidate &c = candidates_[chosen_];
  const double idle = c.idle;
  if (!read(c.cls, &c)) {
    candidates_.erase(candidates_.begin() + static_cast<std::ptrdiff_t>(chosen_));
  } else if (c.idle == idle) {
    // The class's new oldest is as old as the one that went (a store's chunks of one class share
    // its time): the same value, so it is still the first of the smallest.
    node_ = c.node;
    return;
  }
  choose();
}

uint64_t EvictionOrder::size(uint32_t d) const noexcept {
  return d < domains_.size() ? domains_[d]->size : 0;
}

}  // namespace swiftkv

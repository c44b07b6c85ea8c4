#include "core/coord/beat_page.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <utility>

#include "core/common/error.hpp"

namespace swiftkv::coord {

namespace {

// The page in 64-bit words. Each side writes its own 4 KiB pages, so the lender's writes never
// share a cache line with the borrower's. The narrow page, words 0 to 1023:
constexpr size_t kMagicWord = 0;
// The borrower's half.
constexpr size_t kBeatSeq = 8;    // seqlock: odd while the borrower writes
constexpr size_t kBeatCount = 9;  // lease ids that follow
constexpr size_t kBeatIds = 10;
// The lender's half.
constexpr size_t kAnswerSeq = 512;  // seqlock: odd while the lender writes
constexpr size_t kAccepted = 513;   // 1 once the lender reads the page
constexpr size_t kEcho = 514;       // the beat answered
constexpr size_t kAnswerCount = 515;
constexpr size_t kAnswerLeases = 516;  // (lease id, remaining ns | reclaim << 63) pairs

// The wide page's rest: the borrower's ids past kBeatLeases from 8 KiB, the lender's word that
// it accepted the page wide and its answers past kBeatLeases from 16 KiB.
constexpr size_t kWideIds = 1024;
constexpr size_t kWideAccepted = 2048;  // 1 once the lender reads the page wide
constexpr size_t kWideAnswers = 2050;   // pairs, as kAnswerLeases

constexpr uint64_t kReclaimBit = 1ull << 63;

static_assert(kBeatIds + kBeatLeases <= kAnswerSeq, "the borrower's half overruns the lender's");
static_assert((kAnswerLeases + 2 * kBeatLeases) * 8 <= kBeatPageBytes, "the answer overruns");
static_assert(kWideIds * 8 == kBeatPageBytes);
static_assert(kWideIds + kWideBeatLeases - kBeatLeases <= kWideAccepted,
              "the borrower's wide ids overrun the lender's half");
static_assert(kWideAccepted * 8 == kWideBeatPageBytes / 2);
static_assert((kWideAnswers + 2 * (kWideBeatLeases - kBeatLeases)) * 8 <= kWideBeatPageBytes,
              "the wide answer overruns");

// Where the i-th lease id of a beat, and the i-th lease of an answer, lie.
constexpr size_t id_word(size_t i) noexcept {
  return i < kBeatLeases ? kBeatIds + i : kWideIds + (i - kBeatLeases);
}
constexpr size_t answer_word(size_t i) noexcept {
  return i < kBeatLeases ? kAnswerLeases + 2 * i : kWideAnswers + 2 * (i - kBeatLeases);
}

[[noreturn]] void fail_now(const std::string &what) {
  fail(SWIFTKV_ENOMEM, "beat page: " + what + ": " + std::strerror(errno));
}

uint64_t *map_page(int fd, size_t bytes) {
  void *p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  return p == MAP_FAILED ? nullptr : static_cast<uint64_t *>(p);
}

}  // namespace

BeatPage::BeatPage(BeatPage &&o) noexcept
    : fd_(std::move(o.fd_)),
      words_(std::exchange(o.words_, nullptr)),
      bytes_(o.bytes_),
      beat_seq_(o.beat_seq_),
      answer_seq_(o.answer_seq_) {}

BeatPage &BeatPage::operator=(BeatPage &&o) noexcept {
  if (this != &o) {
    if (words_ != nullptr) ::munmap(words_, bytes_);
    fd_ = std::move(o.fd_);
    words_ = std::exchange(o.words_, nullptr);
    bytes_ = o.bytes_;
    beat_seq_ = o.beat_seq_;
    answer_seq_ = o.answer_seq_;
  }
  return *this;
}

BeatPage::~BeatPage() {
  if (words_ != nullptr) ::munmap(words_, bytes_);
}

// A seqlock without fences (which TSan does not model): every word is stored with release, so
// that the odd sequence is seen before any word written after it, and loaded with acquire, so
// that the sequence read again after the words is read after them.
uint64_t BeatPage::load(size_t word) const {
  return std::atomic_ref<uint64_t>(words_[word]).load(std::memory_order_acquire);
}

void BeatPage::store(size_t word, uint64_t v) {
  std::atomic_ref<uint64_t>(words_[word]).store(v, std::memory_order_release);
}

BeatPage BeatPage::create(size_t bytes) {
  bytes = bytes >= kWideBeatPageBytes ? kWideBeatPageBytes : kBeatPageBytes;
  UniqueFd fd(::memfd_create("swiftkv-beat", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd) fail_now("memfd_create");
  if (::ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0) fail_now("ftruncate");
  if (::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    fail_now("sealing");
  }
  uint64_t *w = map_page(fd.get(), bytes);
  if (w == nullptr) fail_now("mmap");
  BeatPage page(std::move(fd), w, bytes);
  std::atomic_ref<uint64_t>(w[kMagicWord]).store(kBeatMagic, std::memory_order_release);
  return page;
}

BeatPage BeatPage::adopt(UniqueFd fd, std::string *why, size_t max_bytes) {
  const int seals = ::fcntl(fd.get(), F_GET_SEALS);
  if (seals < 0) {
    *why = "the beat page is not a memfd";
    return {};
  }
  if ((seals & F_SEAL_SHRINK) == 0) {
    *why = "the beat page is not sealed against shrinking";
    return {};
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0 || st.st_size < static_cast<off_t>(kBeatPageBytes)) {
    *why = "the beat page is smaller than " + std::to_string(kBeatPageBytes) + " bytes";
    return {};
  }
  // Sealed against shrinking: what is mapped stays there while the borrower lives.
  const size_t bytes =
      st.st_size >= static_cast<off_t>(kWideBeatPageBytes) && max_bytes >= kWideBeatPageBytes
          ? kWideBeatPageBytes
          : kBeatPageBytes;
  uint64_t *w = map_page(fd.get(), bytes);
  if (w == nullptr) {
    *why = std::string("mapping the beat page: ") + std::strerror(errno);
    return {};
  }
  BeatPage page(std::move(fd), w, bytes);
  if (std::atomic_ref<uint64_t>(w[kMagicWord]).load(std::memory_order_acquire) != kBeatMagic) {
    *why = "the beat page does not start with its magic";
    return {};
  }
  return page;
}

size_t BeatPage::capacity() const {
  return wide() && load(kWideAccepted) == 1 ? kWideBeatLeases : kBeatLeases;
}

uint64_t BeatPage::write_beat(const std::vector<uint64_t> &leases) {
  const size_t n = std::min(leases.size(), capacity());
  const uint64_t seq = beat_seq_ + 2;
  store(kBeatSeq, seq - 1);
  store(kBeatCount, n);
  for (size_t i = 0; i < n; ++i) store(id_word(i), leases[i]);
  store(kBeatSeq, seq);
  beat_seq_ = seq;
  return seq;
}

bool BeatPage::read_beat(Beat *out, uint64_t newer_than) const {
  const uint64_t s1 = load(kBeatSeq);
  if (s1 == 0 || (s1 & 1) != 0 || s1 <= newer_than) return false;
  const uint64_t n = load(kBeatCount);
  if (n > mapped_leases()) return false;
  out->seq = s1;
  out->leases.resize(n);
  for (size_t i = 0; i < n; ++i) out->leases[i] = load(id_word(i));
  return load(kBeatSeq) == s1;
}

void BeatPage::accept() {
  if (wide()) store(kWideAccepted, 1);  // first: a borrower that sees the page accepted sees it
  store(kAccepted, 1);
}

bool BeatPage::accepted() const { return load(kAccepted) == 1; }

void BeatPage::write_answer(const BeatAnswer &answer) {
  const size_t n = std::min(answer.leases.size(), capacity());
  const uint64_t seq = answer_seq_ + 2;
  store(kAnswerSeq, seq - 1);
  store(kEcho, answer.echo);
  store(kAnswerCount, n);
  for (size_t i = 0; i < n; ++i) {
    const LeaseState &l = answer.leases[i];
    store(answer_word(i), l.lease);
    store(answer_word(i) + 1,
          std::min(l.remaining_ns, kReclaimBit - 1) | (l.reclaim ? kReclaimBit : 0));
  }
  store(kAnswerSeq, seq);
  answer_seq_ = seq;
}

bool BeatPage::read_answer(BeatAnswer *out, uint64_t newer_than) const {
  const uint64_t s1 = load(kAnswerSeq);
  if (s1 == 0 || (s1 & 1) != 0) return false;
  const uint64_t echo = load(kEcho);
  if (echo <= newer_than) return false;
  const uint64_t n = load(kAnswerCount);
  if (n > mapped_leases()) return false;
  out->echo = echo;
  out->leases.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const uint64_t v = load(answer_word(i) + 1);
    out->leases[i] = LeaseState{load(answer_word(i)), v & ~kReclaimBit, (v & kReclaimBit) != 0};
  }
  return load(kAnswerSeq) == s1;
}

void BeatPage::tear_beat_for_test() { store(kBeatSeq, load(kBeatSeq) | 1); }

void BeatPage::tear_answer_for_test() { store(kAnswerSeq, load(kAnswerSeq) | 1); }

}  // namespace swiftkv::coord

// The coordinator's wire format: every message type survives encode/decode field for field, and
// no corruption of a valid message (truncation, extension, any byte changed) crashes the decoder
// or yields a message whose encoding is not the bytes it came from. Also the fd channel's
// packets, and SCM_RIGHTS carrying a memfd across a socket pair.
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <csetjmp>
#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "core/common/error.hpp"
#include "core/coord/fd_channel.hpp"
#include "core/coord/wire.hpp"

extern "C" {
#include <cmocka.h>
}

namespace {

namespace co = swiftkv::coord;

std::vector<co::Message> samples() {
  co::WireGeometry g{36, 8, 128, 16, 256, 1};
  co::Welcome w;
  w.session = 7;
  for (size_t i = 0; i < w.token.size(); ++i) w.token[i] = static_cast<uint8_t>(i * 17);
  w.fd_socket = "swiftkv-coord-1-2-3";
  w.lender = g;
  w.borrower = co::WireGeometry{64, 8, 128, 16, 256, 1};
  w.unit_blocks = 9;
  w.unit_chunks = 5;
  w.unit_bytes = 1 << 20;
  w.capacity_units = 100;
  w.lease_ns = 10'000'000'000;
  w.memory_kind = 1;
  w.device = 3;
  w.region_bytes = 100 << 20;
  w.identity = "host-memfd-42";
  w.ipc_handle[63] = 0xab;
  w.ucx_address = {0x10, 0x20, 0x30};
  co::HeartbeatAck ack;
  ack.echo = 12;
  ack.leases = {{1, 500, false}, {9, 0, true}};
  return {
      {1, 0, co::Hello{g, 4242, "lender-a", "boot-id net:[4026531840]", 1}},
      {1, 3, w},
      {1, 0, co::Refuse{SWIFTKV_ENOTFOUND, "no region"}},
      {5, 0, co::Lend{3, 17}},
      {6, 4, co::Grant{3, 11, 40, 17, 2, {0xaa, 0xbb}, 0x7f0000001000}},
      {7, 4, co::Deny{4, SWIFTKV_ENOMEM, "nothing free"}},
      {8, 0, co::Heartbeat{{11, 12, 13}}},
      {9, 5, ack},
      {10, 6, co::Reclaim{11}},
      {11, 0, co::Release{11}},
      {12, 0, co::Bye{}},
  };
}

void every_type_round_trips(void **) {
  const std::vector<co::Message> ms = samples();
  assert_int_equal(ms.size(), 11);  // one per type
  for (const co::Message &m : ms) {
    const std::vector<uint8_t> b = co::encode(m);
    const co::Decoded d = co::decode(b);
    if (!d.message) fail_msg("%s: %s", co::msg_type_name(co::type_of(m.payload)), d.error.c_str());
    assert_int_equal(d.message->seq, m.seq);
    assert_int_equal(d.message->epoch, m.epoch);
    assert_int_equal(d.message->payload.index(), m.payload.index());
    assert_true(co::encode(*d.message) == b);  // field for field: the same bytes again
  }
  // Spot checks of decoded fields.
  const co::Decoded w = co::decode(co::encode(ms[1]));
  const auto &got = std::get<co::Welcome>(w.message->payload);
  assert_string_equal(got.identity.c_str(), "host-memfd-42");
  assert_int_equal(got.ipc_handle[63], 0xab);
  assert_int_equal(got.borrower.num_layers, 64);
  assert_true(got.ucx_address == std::vector<uint8_t>({0x10, 0x20, 0x30}));
  const co::Decoded h = co::decode(co::encode(ms[0]));
  const auto &hello = std::get<co::Hello>(h.message->payload);
  assert_string_equal(hello.host.c_str(), "boot-id net:[4026531840]");
  assert_int_equal(hello.path, 1);
  const co::Decoded gd = co::decode(co::encode(ms[4]));
  const auto &grant = std::get<co::Grant>(gd.message->payload);
  assert_true(grant.rkey == std::vector<uint8_t>({0xaa, 0xbb}));
  assert_int_equal(grant.remote_base, 0x7f0000001000);
  const co::Decoded a = co::decode(co::encode(ms[7]));
  const auto &acks = std::get<co::HeartbeatAck>(a.message->payload);
  assert_int_equal(acks.leases.size(), 2);
  assert_true(acks.leases[1].reclaim);
  assert_int_equal(acks.leases[0].remaining_ns, 500);
}

// FNV-1a over bytes: a short fingerprint for the pinned encodings below.
uint64_t fnv1a(const std::vector<uint8_t> &b, uint64_t h = 0xcbf29ce484222325ull) {
  for (uint8_t x : b) h = (h ^ x) * 0x100000001b3ull;
  return h;
}

// The format is pinned: the encodings of the samples are the bytes protocol version 2 has always
// had (version 3 changed only the header's version). A change here breaks every peer on an older
// library; it needs a new protocol version.
void format_is_pinned(void **) {
  const std::vector<uint8_t> grant =
      co::encode(co::Message{6, 4, co::Grant{3, 11, 40, 17, 2, {0xaa, 0xbb}, 0x1000}});
  const std::vector<uint8_t> want = {
      0x53, 0x57, 0x4b, 0x56, 0x03, 0x00, 0x05, 0x00,  // magic "SWKV", version 3, type grant
      0x06, 0,    0,    0,    0,    0,    0,    0,     // seq
      0x04, 0,    0,    0,    0,    0,    0,    0,     // epoch
      0x32, 0,    0,    0,    0,    0,    0,    0,     // payload length 50, reserved
      0x03, 0,    0,    0,    0,    0,    0,    0,
      0x0b, 0,    0,    0,    0,    0,    0,    0,  // request, lease
      0x28, 0,    0,    0,    0,    0,    0,    0,
      0x11, 0,    0,    0,    0,    0,    0,    0,  // first unit, units
      0x02, 0,    0,    0,                          // pieces
      0x02, 0,    0,    0,    0xaa, 0xbb,           // the remote key: length, bytes
      0x00, 0x10, 0,    0,    0,    0,    0,    0,  // remote base
  };
  assert_true(grant == want);
  uint64_t h = 0xcbf29ce484222325ull;
  for (const co::Message &m : samples()) h = fnv1a(co::encode(m), h);
  co::PiecePacket p{9, 2, {{0, 4096, 1}, {8192, 4096, 3}}};
  h = fnv1a(co::encode_pieces(p), h);
  h = fnv1a(co::encode_auth(co::FdAuth{77, {1, 2, 3}}), h);
  assert_int_equal(h, 0xeef69aaa9d798a3cull);  // version 3 headers
}

void corruption_never_crashes(void **) {
  std::mt19937_64 rng(12345);
  uint64_t rejected = 0, accepted = 0;
  for (const co::Message &m : samples()) {
    const std::vector<uint8_t> b = co::encode(m);
    for (size_t n = 0; n < b.size(); ++n) {  // every truncation is refused
      const std::vector<uint8_t> cut(b.begin(), b.begin() + static_cast<std::ptrdiff_t>(n));
      assert_false(co::decode(cut).message.has_value());
    }
    std::vector<uint8_t> longer = b;
    longer.push_back(0);
    assert_false(co::decode(longer).message.has_value());
    for (int i = 0; i < 2000; ++i) {
      std::vector<uint8_t> x = b;
      const int flips = 1 + static_cast<int>(rng() % 4);
      for (int f = 0; f < flips; ++f) x[rng() % x.size()] ^= static_cast<uint8_t>(1 + rng() % 255);
      const co::Decoded d = co::decode(x);
      if (!d.message) {
        assert_false(d.error.empty());
        ++rejected;
        continue;
      }
      // What is accepted is exactly what the bytes say: it encodes back to them.
      assert_true(co::encode(*d.message) == x);
      ++accepted;
    }
  }
  assert_true(rejected > 0 && accepted > 0);
  // Counts past the payload, oversize strings and huge messages are refused before allocating.
  std::vector<uint8_t> hb = co::encode(co::Message{1, 0, co::Heartbeat{{1}}});
  hb[32] = 0xff;
  hb[33] = 0xff;
  hb[34] = 0xff;
  hb[35] = 0x7f;
  assert_false(co::decode(hb).message.has_value());
  std::vector<uint8_t> big(co::kMaxMessageBytes + 1, 0);
  assert_false(co::decode(big).message.has_value());
  assert_false(co::decode(co::encode(co::Message{0, 0, co::Bye{}})).message.has_value());
}

void pieces_and_auth(void **) {
  co::PiecePacket p;
  p.tag = 9;
  p.more = 2;
  p.pieces = {{0, 4096, 1}, {8192, 4096, 3}};
  std::string err;
  const auto q = co::decode_pieces(co::encode_pieces(p), &err);
  assert_true(q.has_value());
  assert_int_equal(q->tag, 9);
  assert_int_equal(q->more, 2);
  assert_int_equal(q->pieces.size(), 2);
  assert_int_equal(q->pieces[1].generation, 3);
  std::vector<uint8_t> bad = co::encode_pieces(p);
  bad.pop_back();
  assert_false(co::decode_pieces(bad, &err).has_value());
  const co::FdAuth a{77, {1, 2, 3}};
  const auto b = co::decode_auth(co::encode_auth(a));
  assert_true(b.has_value() && b->session == 77 && b->token == a.token);
  std::vector<uint8_t> ba = co::encode_auth(a);
  ba[0] ^= 1;
  assert_false(co::decode_auth(ba).has_value());
}

// A memfd sent over the fd channel arrives as a new descriptor of the same file.
void fds_cross_a_socket(void **) {
  int sv[2];
  assert_int_equal(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
  swiftkv::UniqueFd a(sv[0]), b(sv[1]);
  swiftkv::UniqueFd mem(memfd_create("wire-test", MFD_CLOEXEC));
  assert_true(static_cast<bool>(mem));
  assert_int_equal(ftruncate(mem.get(), 4096), 0);
  assert_int_equal(pwrite(mem.get(), "swiftkv", 7, 100), 7);
  const int fds[] = {mem.get()};
  const std::vector<uint8_t> msg{1, 2, 3};
  co::fd_send(a.get(), msg, fds);
  co::FdPacket p = co::fd_recv(b.get(), 1000);
  assert_false(p.closed);
  assert_true(p.bytes == msg);
  assert_int_equal(p.fds.size(), 1);
  char buf[8] = {0};
  assert_int_equal(pread(p.fds[0].get(), buf, 7, 100), 7);
  assert_string_equal(buf, "swiftkv");
  assert_false(co::fd_peer_gone(b.get()));
  a.reset();
  assert_true(co::fd_peer_gone(b.get()));
  assert_true(co::fd_recv(b.get(), 1000).closed);
  try {
    co::fd_recv(b.get(), 0);
  } catch (const swiftkv::Error &e) {
    fail_msg("a closed socket reads as closed, not as an error: %s", e.what());
  }
}

}  // namespace

int main() {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(every_type_round_trips),   cmocka_unit_test(format_is_pinned),
      cmocka_unit_test(corruption_never_crashes), cmocka_unit_test(pieces_and_auth),
      cmocka_unit_test(fds_cross_a_socket),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}

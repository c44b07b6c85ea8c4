// Loads (gets) and stores (puts) of whole chunks over UCX between two processes, against
// ucx_perftest's ucp_get / ucp_put bandwidth over the same transport in the same run.
//
// For each SwiftCache Table 2 model and 16- and 256-token chunks (float16), one repetition moves
// a batch of chunks (about --batch-mib MiB) in one call: every chunk one operation, all issued
// at once, one completion wait. The baseline is ucx_perftest moving the same number of messages
// of the same size; the two alternate (perftest, ours, perftest, ours, ...) after a warm-up of
// each. Prints median / best GB/s per direction, the ratio of the medians, and a JSON line.
//
// A third column is the link itself: the same bytes through one TCP socket on loopback between
// the same two processes (the serving process writes them, or reads them and acknowledges), the
// most any transport over tcp could move.
//
// The serving side is this program again ("--serve TLS BYTES"): a registered buffer, progressed
// on its event fd, as a lender's coordinator thread does, and a TCP listener for the socket
// baseline.
//
// The library's own columns ("retrieve", "store") move the same chunks through the public API:
// a lender context lends an elastic region laid out for the model over tcp:// (its coordinator
// thread serves UCX), and a borrower context that reaches it over UCX stores the chunks
// (swiftkv_store: a put batch per chunk) and retrieves them (swiftkv_retrieve: one get batch for
// all, straight into the caller's buffer), checking the bytes once. Both contexts live in this
// process; the lent bytes still cross UCX's tcp transport on loopback.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "child_process.hpp"
#include "core/common/error.hpp"
#include "core/transport/ucx_transport.hpp"
#include "paper_models.h"
#include "swiftkv/swiftkv.h"

namespace {

namespace tr = swiftkv::transport;

struct Options {
  int reps = 5;
  uint64_t batch_mib = 256;
  std::string transports = "tcp";
  bool quick = false;
  bool json = false;
};

bool full_io(int fd, std::byte *p, size_t n, bool write) {
  while (n > 0) {
    const ssize_t k = write ? ::send(fd, p, n, MSG_NOSIGNAL) : ::recv(fd, p, n, 0);
    if (k <= 0) return false;
    p += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

// One socket-baseline command: 'g' + 8-byte length (the server sends that many bytes) or 'p' +
// length (it receives them, then sends one byte).
void socket_command(int fd, std::vector<std::byte> &mem) {
  char cmd = 0;
  uint64_t n = 0;
  if (::recv(fd, &cmd, 1, MSG_WAITALL) != 1 ||
      !full_io(fd, reinterpret_cast<std::byte *>(&n), sizeof n, false) || n > mem.size()) {
    std::exit(0);
  }
  if (cmd == 'g') {
    full_io(fd, mem.data(), n, true);
  } else {
    full_io(fd, mem.data(), n, false);
    std::byte ack{1};
    full_io(fd, &ack, 1, true);
  }
}

int serve(const std::string &transports, uint64_t bytes) {
  tr::UcxOptions o;
  o.transports = transports;
  auto ctx = tr::UcxContext::create(o);
  std::vector<std::byte> mem(bytes, std::byte{0x5a});
  auto reg = ctx->register_memory(mem.data(), bytes);
  const int lfd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (lfd < 0 || ::bind(lfd, reinterpret_cast<sockaddr *>(&a), sizeof a) != 0 ||
      ::listen(lfd, 1) != 0 || ::getsockname(lfd, reinterpret_cast<sockaddr *>(&a), &len) != 0) {
    return 1;
  }
  std::printf("%s\n%s\n%llu\n%u\n", hex_of(ctx->serving_address()).c_str(),
              hex_of(reg->packed_key()).c_str(), static_cast<unsigned long long>(reg->base()),
              static_cast<unsigned>(ntohs(a.sin_port)));
  std::fflush(stdout);
  int cfd = -1;
  ctx->serve();
  for (;;) {
    pollfd p[3] = {
        {ctx->serving_event_fd(), POLLIN, 0}, {0, POLLIN, 0}, {cfd >= 0 ? cfd : lfd, POLLIN, 0}};
    ::poll(p, 3, 100);
    if (p[1].revents != 0) {
      char c;
      if (::read(0, &c, 1) <= 0) return 0;
    }
    if (p[2].revents != 0) {
      if (cfd < 0) {
        cfd = ::accept(lfd, nullptr, nullptr);
      } else {
        socket_command(cfd, mem);
      }
    }
    ctx->serve();
  }
}

// Runs a command, returns its standard output (empty when it failed).
std::string run_capture(const std::vector<std::string> &args) {
  PipedChild c = spawn_piped(args);
  if (c.pid < 0) return {};
  ::close(c.in);
  std::string s;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, c.out)) > 0;) s.append(buf, n);
  std::fclose(c.out);
  int status = 0;
  ::waitpid(c.pid, &status, 0);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? s : std::string();
}

// ucx_perftest's overall bandwidth in GB/s (its MB is 2^20 bytes), or a negative number.
double perftest(const char *test, uint64_t bytes, uint64_t iters) {
  static int port = 20000 + static_cast<int>(::getpid() % 20000);
  std::string out;
  // A server that exits at once found its port taken (another process's, or one of this
  // machine's connections): the next port is tried, up to 5.
  for (int attempt = 0; attempt < 5 && out.empty(); ++attempt) {
    ++port;
    // The server's output is not read: its pipe is closed as soon as it started.
    PipedChild server = spawn_piped({"ucx_perftest", "-p", std::to_string(port)});
    if (server.pid > 0) {
      ::close(server.in);
      std::fclose(server.out);
    }
    // The client fails while the server is not listening yet: tried again for up to 15 s (a
    // loaded machine, a sanitizer build beside it, took over a second), not once the server is
    // gone.
    bool server_alive = server.pid > 0;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(15);
    while (out.empty() && server_alive && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      out = run_capture({"ucx_perftest", "127.0.0.1", "-p", std::to_string(port), "-t", test, "-s",
                         std::to_string(bytes), "-n", std::to_string(iters), "-w", "2"});
      if (out.empty()) server_alive = ::waitpid(server.pid, nullptr, WNOHANG) == 0;
    }
    if (server_alive) {
      ::kill(server.pid, SIGTERM);
      ::waitpid(server.pid, nullptr, 0);
    }
    if (server.pid <= 0) break;  // ucx_perftest is not there: no other port helps
  }
  const size_t at = out.find("Final:");
  if (at == std::string::npos) {
    std::fprintf(stderr,
                 "bench_remote: ucx_perftest -t %s gave no result (is ucx-utils "
                 "installed?)\n",
                 test);
    std::exit(1);
  }
  double f[8] = {};
  if (std::sscanf(out.c_str() + at, "Final: %lf %lf %lf %lf %lf %lf %lf %lf", &f[0], &f[1], &f[2],
                  &f[3], &f[4], &f[5], &f[6], &f[7]) != 8) {
    return -1;
  }
  return f[5] * 1048576.0 / 1e9;
}

[[noreturn]] void die(const char *what) {
  std::fprintf(stderr, "bench_remote: %s: %s\n", what, swiftkv_last_error_message());
  std::exit(1);
}

void check(swiftkv_status s, const char *what) {
  if (s != SWIFTKV_OK) die(what);
}

// A borrower that stores and retrieves `chunks` chunks of `tokens`-token chunks of model `which`
// in memory lent over UCX, through the public API.
class Library {
 public:
  Library(int which, uint32_t tokens, uint64_t chunks, const std::string &transports) {
    const int port = free_tcp_port();
    if (port < 0) die("no free tcp port");
    const std::string endpoint = "tcp://127.0.0.1:" + std::to_string(port);
    const swiftkv_model_desc lent_as = swiftkv_paper_desc(which, 16, tokens);
    uint64_t chunk = 0;
    check(swiftkv_geometry_bytes_per_token(&lent_as, &chunk), "bytes per token");
    chunk *= tokens;
    // Owned: one chunk's worth of blocks; the rest (the chunks and a spare) is lent.
    const uint64_t blocks_per_chunk = tokens / 16;
    swiftkv_ctx_config lc = SWIFTKV_CTX_CONFIG_INIT;
    lc.host_budget_bytes = (chunks + 2) * chunk + (64 << 20);
    lc.coord_endpoint = endpoint.c_str();
    lc.coord_ucx_transports = transports.c_str();
    check(swiftkv_ctx_create(&lender_, &lc), "lender context");
    swiftkv_elastic_config ec = SWIFTKV_ELASTIC_CONFIG_INIT;
    ec.lender = &lent_as;
    ec.borrower = &lent_as;
    ec.capacity_blocks = (chunks + 2) * blocks_per_chunk;
    ec.owned_blocks = blocks_per_chunk;
    check(swiftkv_elastic_create(&region_, lender_, &ec), "region");
    check(swiftkv_elastic_offer(region_, "bench"), "offer");
    swiftkv_ctx_config bc = SWIFTKV_CTX_CONFIG_INIT;
    bc.host_budget_bytes = 0;  // every chunk in lent memory, or not cached at all
    bc.demote_free_percent = 0;
    bc.coord_remote_path = SWIFTKV_REMOTE_PATH_UCX;
    bc.coord_ucx_transports = transports.c_str();
    check(swiftkv_ctx_create(&borrower_, &bc), "borrower context");
    swiftkv_model_config mc = SWIFTKV_MODEL_CONFIG_INIT;
    mc.desc = &lent_as;
    check(swiftkv_model_register(&model_, borrower_, &mc), "register");
    uint64_t lease = 0;
    check(swiftkv_borrow_remote(&lease, borrower_, model_, endpoint.c_str(), "bench", UINT32_MAX),
          "borrow");
    tokens_.resize(chunks * tokens);
    for (size_t i = 0; i < tokens_.size(); ++i) tokens_[i] = static_cast<uint32_t>(i * 7 + 1);
    kv_.resize(chunks * chunk);
    for (size_t i = 0; i < kv_.size(); ++i) kv_[i] = static_cast<uint8_t>(i * 131 + i / 4099);
    back_.resize(kv_.size());
  }
  ~Library() {
    swiftkv_ctx_destroy(borrower_);
    swiftkv_elastic_destroy(region_);
    swiftkv_ctx_destroy(lender_);
  }
  Library(const Library &) = delete;
  Library &operator=(const Library &) = delete;

  // Seconds to store every chunk (from none cached); the chunks stay cached.
  double store() {
    uint64_t cleared = 0, cached = 0;
    check(swiftkv_clear(&cleared, borrower_, model_, SWIFTKV_TIERS_ALL, tokens_.data(),
                        tokens_.size()),
          "clear");
    const auto t0 = std::chrono::steady_clock::now();
    check(swiftkv_store(&cached, borrower_, model_, tokens_.data(), tokens_.size(), kv_.data(),
                        kv_.size()),
          "store");
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (cached != tokens_.size()) {
      std::fprintf(stderr, "bench_remote: stored %llu of %zu tokens in lent memory\n",
                   static_cast<unsigned long long>(cached), tokens_.size());
      std::exit(1);
    }
    return s;
  }
  // Seconds to retrieve every chunk; with `verify`, checks the bytes.
  double retrieve(bool verify) {
    uint64_t loaded = 0;
    const auto t0 = std::chrono::steady_clock::now();
    check(swiftkv_retrieve(&loaded, borrower_, model_, tokens_.data(), tokens_.size(), 0,
                           back_.data(), back_.size()),
          "retrieve");
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (loaded != tokens_.size() || (verify && back_ != kv_)) {
      std::fprintf(stderr, "bench_remote: retrieved %llu of %zu tokens%s\n",
                   static_cast<unsigned long long>(loaded), tokens_.size(),
                   verify ? " (or wrong bytes)" : "");
      std::exit(1);
    }
    return s;
  }
  // The UCX batches the borrower ran so far.
  uint64_t batches() const {
    swiftkv_coord_stats cs = SWIFTKV_COORD_STATS_INIT;
    check(swiftkv_coord_stats_get(&cs, borrower_), "coord stats");
    return cs.rma_batches;
  }

 private:
  swiftkv_ctx *lender_ = nullptr;
  swiftkv_elastic *region_ = nullptr;
  swiftkv_ctx *borrower_ = nullptr;
  uint32_t model_ = 0;
  std::vector<uint32_t> tokens_;
  std::vector<uint8_t> kv_, back_;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}
double best(const std::vector<double> &v) {
  return v.empty() ? 0 : *std::max_element(v.begin(), v.end());
}

}  // namespace

int main(int argc, char **argv) {
  if (argc == 4 && std::strcmp(argv[1], "--serve") == 0) {
    return serve(argv[2], std::stoull(argv[3]));
  }
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_remote: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--reps")
      o.reps = std::stoi(next());
    else if (a == "--batch-mib")
      o.batch_mib = std::stoull(next());
    else if (a == "--transports")
      o.transports = next();
    else if (a == "--quick")
      o.quick = true;
    else if (a == "--json")
      o.json = true;
    else {
      std::fprintf(stderr,
                   "usage: bench_remote [--reps N] [--batch-mib M] [--transports TLS] [--quick] "
                   "[--json]\n");
      return 2;
    }
  }
  if (o.quick) {
    o.reps = 1;
    o.batch_mib = 8;
  }
  if (o.reps < 1 || o.batch_mib < 1) {
    std::fprintf(stderr, "bench_remote: --reps and --batch-mib must be at least 1\n");
    return 2;
  }
  if (!tr::ucx_built()) {
    std::printf("bench_remote: built without UCX\n");
    return 77;
  }
  ::signal(SIGPIPE, SIG_IGN);
  // ucx_perftest reads the transports from the environment; so does the serving process.
  ::setenv("UCX_TLS", o.transports.c_str(), 1);

  // The largest chunk of the table decides the serving buffer: at least one chunk per batch.
  uint64_t max_chunk = 0;
  for (const auto &m : swiftkv_paper_models) {
    max_chunk =
        std::max<uint64_t>(max_chunk, 2ull * m.num_layers * m.num_kv_heads * m.head_dim * 2 * 256);
  }
  const uint64_t region = std::max<uint64_t>(o.batch_mib << 20, max_chunk);

  PipedChild server = spawn_piped({argv[0], "--serve", o.transports, std::to_string(region)});
  const std::vector<std::string> lines =
      server.pid > 0 ? read_lines(server.out, 4) : std::vector<std::string>();
  if (lines.size() != 4) {
    std::fprintf(stderr, "bench_remote: the serving process did not start\n");
    return 1;
  }

  tr::UcxOptions uo;
  uo.transports = o.transports;
  auto ctx = tr::UcxContext::create(uo);
  auto ep = ctx->connect(bytes_of_hex(lines[0]));
  ep->add_range(1, {bytes_of_hex(lines[1]), std::stoull(lines[2]), region});
  std::vector<std::byte> local(region, std::byte{0x33});
  const int sfd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  sa.sin_port = htons(static_cast<uint16_t>(std::stoul(lines[3])));
  if (sfd < 0 || ::connect(sfd, reinterpret_cast<sockaddr *>(&sa), sizeof sa) != 0) {
    std::fprintf(stderr, "bench_remote: the socket baseline could not connect\n");
    return 1;
  }
  // The socket moves `total` bytes in commands of at most the region's size.
  auto socket_gbps = [&](char cmd, uint64_t total) {
    const auto t0 = std::chrono::steady_clock::now();
    for (uint64_t done = 0; done < total;) {
      const uint64_t n = std::min(total - done, region);
      if (::send(sfd, &cmd, 1, MSG_NOSIGNAL) != 1 ||
          !full_io(sfd, reinterpret_cast<std::byte *>(const_cast<uint64_t *>(&n)), sizeof n,
                   true) ||
          !full_io(sfd, local.data(), n, cmd == 'p')) {
        std::fprintf(stderr, "bench_remote: the socket baseline failed\n");
        std::exit(1);
      }
      if (cmd == 'p') {
        std::byte ack{};
        full_io(sfd, &ack, 1, false);
      }
      done += n;
    }
    return static_cast<double>(total) /
           std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / 1e9;
  };

  std::printf(
      "bench_remote: transports %s, %d repetitions, batches of about %llu MiB, GB/s "
      "median / best\n\n",
      o.transports.c_str(), o.reps, static_cast<unsigned long long>(o.batch_mib));
  std::printf(
      "| model | tokens | chunk | chunks/batch | get | retrieve | ucx_perftest get | retrieve / "
      "perftest | socket read | put | store | ucx_perftest put | socket write | chunks/s "
      "(retrieve) | bar |\n");
  std::printf(
      "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- "
      "|\n");
  std::string json = "{\"bench\":\"remote\",\"transports\":\"" + o.transports + "\",\"rows\":[";
  bool first_row = true;
  for (int which = 0; which < SWIFTKV_PAPER_MODEL_COUNT; ++which) {
    const swiftkv_paper_model &m = swiftkv_paper_models[which];
    // A quick run (the smoke test) keeps the smallest and the largest of the Qwen3 models.
    if (o.quick && std::strcmp(m.name, "Qwen3-8B") != 0 && std::strcmp(m.name, "Qwen3-32B") != 0) {
      continue;
    }
    for (uint64_t tokens : {16ull, 256ull}) {
      const uint64_t chunk = 2ull * m.num_layers * m.num_kv_heads * m.head_dim * 2 * tokens;
      const uint64_t n =
          std::max<uint64_t>(1, std::min<uint64_t>((o.batch_mib << 20) / chunk, region / chunk));
      // Every measurement moves the same chunks: `batches` batches of n (at least 256 MiB, or
      // the batch size when that is larger).
      const uint64_t batches =
          std::max<uint64_t>(1, ((o.quick ? 8ull : 256ull) << 20) / (n * chunk));
      const uint64_t total = batches * n * chunk;
      auto ours = [&](tr::RmaOp::Kind kind) {
        std::vector<tr::RmaOp> ops;
        for (uint64_t c = 0; c < n; ++c)
          ops.push_back({kind, c * chunk, local.data() + c * chunk, chunk});
        const auto t0 = std::chrono::steady_clock::now();
        for (uint64_t b = 0; b < batches; ++b) ep->run(1, ops, 600'000'000'000ULL);
        const double s =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        return static_cast<double>(total) / s / 1e9;
      };
      // Through the library: the same n chunks per call, `batches` calls per measurement.
      Library lib(which, static_cast<uint32_t>(tokens), n, o.transports);
      auto library = [&](bool retrieve) {
        double s = 0;
        for (uint64_t b = 0; b < batches; ++b) s += retrieve ? lib.retrieve(false) : lib.store();
        return static_cast<double>(total) / s / 1e9;
      };
      std::vector<double> get, pget, sget, put, pput, sput, lget, lput;
      // Warm-up of each (the library's checks its bytes and that a retrieve is one batch), then
      // alternate.
      ours(tr::RmaOp::Kind::get);
      ours(tr::RmaOp::Kind::put);
      lib.store();
      const uint64_t batches_before = lib.batches();
      lib.retrieve(true);
      if (lib.batches() != batches_before + 1) {
        std::fprintf(stderr, "bench_remote: a retrieve of %llu chunks ran %llu UCX batches\n",
                     static_cast<unsigned long long>(n),
                     static_cast<unsigned long long>(lib.batches() - batches_before));
        return 1;
      }
      socket_gbps('g', total);
      perftest("ucp_get", chunk, total / chunk);
      for (int r = 0; r < o.reps; ++r) {
        pget.push_back(perftest("ucp_get", chunk, total / chunk));
        sget.push_back(socket_gbps('g', total));
        get.push_back(ours(tr::RmaOp::Kind::get));
        lget.push_back(library(true));
        pput.push_back(perftest("ucp_put_bw", chunk, total / chunk));
        sput.push_back(socket_gbps('p', total));
        put.push_back(ours(tr::RmaOp::Kind::put));
        lput.push_back(library(false));
      }
      const double rl = median(lget) / median(pget);
      const double rate = median(lget) * 1e9 / static_cast<double>(chunk);
      // The design's bar, at 256-token chunks: retrieve and store at >= 90% of ucx_perftest's
      // get and put.
      const bool barred = tokens == 256;
      const bool meets = rl >= 0.9 && median(lput) >= 0.9 * median(pput);
      std::printf(
          "| %s | %llu | %.2f MiB | %llu | %.2f / %.2f | %.2f / %.2f | %.2f / %.2f | %.2f | %.2f | "
          "%.2f / %.2f | %.2f / %.2f | %.2f / %.2f | %.2f | %.0f | %s |\n",
          m.name, static_cast<unsigned long long>(tokens), static_cast<double>(chunk) / 1048576.0,
          static_cast<unsigned long long>(n), median(get), best(get), median(lget), best(lget),
          median(pget), best(pget), rl, median(sget), median(put), best(put), median(lput),
          best(lput), median(pput), best(pput), median(sput), rate,
          !barred ? "-"
          : meets ? "met"
                  : "MISSED");
      std::fflush(stdout);
      char buf[768];
      std::snprintf(buf, sizeof buf,
                    "%s{\"model\":\"%s\",\"tokens\":%llu,\"chunk_bytes\":%llu,\"chunks\":%llu,"
                    "\"get_gbps\":%.4f,\"retrieve_gbps\":%.4f,\"perftest_get_gbps\":%.4f,"
                    "\"socket_read_gbps\":%.4f,\"put_gbps\":%.4f,\"store_gbps\":%.4f,"
                    "\"perftest_put_gbps\":%.4f,\"socket_write_gbps\":%.4f%s}",
                    first_row ? "" : ",", m.name, static_cast<unsigned long long>(tokens),
                    static_cast<unsigned long long>(chunk), static_cast<unsigned long long>(n),
                    median(get), median(lget), median(pget), median(sget), median(put),
                    median(lput), median(pput), median(sput),
                    !barred ? ""
                    : meets ? ",\"meets_bar\":true"
                            : ",\"meets_bar\":false");
      json += buf;
      first_row = false;
    }
  }
  json += "]}";
  if (o.json) std::printf("\n%s\n", json.c_str());
  ep.reset();
  ::close(sfd);
  ::close(server.in);
  std::fclose(server.out);
  ::waitpid(server.pid, nullptr, 0);
  return 0;
}

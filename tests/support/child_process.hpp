// Child processes for the multi-process tests and benchmarks: a program started with its standard
// input and output on pipes, the lines it prints, byte strings (UCX addresses and keys) as hex
// text on a command line or in its output, and a loopback port for a peer to listen on.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <spawn.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

extern char **environ;

inline std::string hex_of(const std::vector<std::byte> &b) {
  static const char *d = "0123456789abcdef";
  std::string s;
  for (std::byte x : b) {
    s += d[static_cast<unsigned>(x) >> 4];
    s += d[static_cast<unsigned>(x) & 15];
  }
  return s;
}

inline std::vector<std::byte> bytes_of_hex(const std::string &s) {
  std::vector<std::byte> b(s.size() / 2);
  for (size_t i = 0; i < b.size(); ++i) {
    b[i] = static_cast<std::byte>(std::stoul(s.substr(2 * i, 2), nullptr, 16));
  }
  return b;
}

struct PipedChild {
  pid_t pid = -1;       // -1: it could not be started
  int in = -1;          // its standard input
  FILE *out = nullptr;  // its standard output
};

// Starts args[0] (looked up in PATH unless it has a slash) with the rest as its arguments.
inline PipedChild spawn_piped(const std::vector<std::string> &args) {
  PipedChild c;
  int in[2], out[2];
  if (::pipe(in) != 0) return c;
  if (::pipe(out) != 0) {
    ::close(in[0]);
    ::close(in[1]);
    return c;
  }
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, in[0], 0);
  posix_spawn_file_actions_adddup2(&fa, out[1], 1);
  posix_spawn_file_actions_addclose(&fa, in[1]);
  posix_spawn_file_actions_addclose(&fa, out[0]);
  std::vector<char *> argv;
  for (const std::string &a : args) argv.push_back(const_cast<char *>(a.c_str()));
  argv.push_back(nullptr);
  const int rc = posix_spawnp(&c.pid, argv[0], &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  ::close(in[0]);
  ::close(out[1]);
  if (rc != 0) {
    ::close(in[1]);
    ::close(out[0]);
    c.pid = -1;
    return c;
  }
  c.in = in[1];
  c.out = ::fdopen(out[0], "r");
  return c;
}

// Up to `n` lines of a child's output, without their newlines (fewer when it ends first).
inline std::vector<std::string> read_lines(FILE *f, size_t n) {
  std::vector<std::string> lines;
  char *line = nullptr;
  size_t cap = 0;
  while (lines.size() < n && ::getline(&line, &cap, f) > 0) {
    std::string l(line);
    while (!l.empty() && l.back() == '\n') l.pop_back();
    lines.push_back(l);
  }
  std::free(line);
  return lines;
}

// A loopback TCP port that was free a moment ago (another process may take it first), or -1.
inline int free_tcp_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr *>(&a), sizeof a) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr *>(&a), &len) == 0;
  ::close(fd);
  return ok ? ntohs(a.sin_port) : -1;
}

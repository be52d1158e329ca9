// strata_transport_bench: transport/transport.h between two processes on loopback (fork; rank 1 echoes).
// One-way latency is half a ping-pong's round trip (p50/p99); bandwidth is one-way messages back to back, then an
// acknowledgement. Usage: strata_transport_bench [iterations per size, default 200] [message bytes ...]
// (default sizes: 16 KiB, 256 KiB, 4 MiB, 64 MiB; bench/group_speed.py passes a group's hop sizes)
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/time/clock.h"
#include "bench/bench_util.h"
#include "transport/transport.h"

namespace t = strata::transport;

namespace {

constexpr uint32_t kPing = 1, kBulk = 2, kAck = 3, kStop = 4;

t::TransportOptions Options(int rank) {
  t::TransportOptions options;
  options.rank = rank;
  options.group_size = 2;
  options.secret = "bench";
  options.bind_host = "127.0.0.1";
  return options;
}

int Echo(int port_fd) {
  int port = 0;
  if (read(port_fd, &port, sizeof port) != sizeof port) return 1;
  auto transport = t::Transport::Start(Options(1));
  if (!transport.ok()) return 1;
  auto link = (*transport)->Connect(0, "127.0.0.1", port, absl::Now() + absl::Seconds(30));
  if (!link.ok()) return 1;
  for (;;) {
    auto m = (*link)->Receive(absl::InfiniteFuture());
    if (!m.ok() || m->kind == kStop) break;
    if (m->kind == kPing) {
      const absl::string_view part = m->bytes;
      if (!(*link)->Send(kPing, {&part, 1}).ok()) break;
    } else if (m->kind == kAck) {
      if (!(*link)->Send(kAck, {}).ok()) break;
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int iterations = 200;
  if (argc > 1 && !absl::SimpleAtoi(argv[1], &iterations)) return 2;
  int fds[2];
  if (pipe(fds) != 0) return 1;
  const pid_t child = fork();
  if (child == 0) {
    close(fds[1]);
    _exit(Echo(fds[0]));
  }
  close(fds[0]);
  auto transport = t::Transport::Start(Options(0));
  if (!transport.ok()) {
    std::fprintf(stderr, "%s\n", std::string(transport.status().message()).c_str());
    return 1;
  }
  const int port = (*transport)->port();
  if (write(fds[1], &port, sizeof port) != sizeof port) return 1;
  auto link = (*transport)->Accept(1, absl::Now() + absl::Seconds(30));
  if (!link.ok()) {
    std::fprintf(stderr, "%s\n", std::string(link.status().message()).c_str());
    return 1;
  }
  std::printf("strata transport over UCX, two processes on loopback, %s\n", strata::bench::CpuName().c_str());
  std::printf("%10s %14s %14s %14s\n", "bytes", "p50 one-way", "p99 one-way", "bandwidth");
  std::vector<size_t> sizes = {16 << 10, 256 << 10, 4 << 20, 64 << 20};
  if (argc > 2) sizes.clear();
  for (int a = 2; a < argc; ++a) {
    size_t size = 0;
    if (!absl::SimpleAtoi(argv[a], &size) || size == 0) return 2;
    sizes.push_back(size);
  }
  for (size_t size : sizes) {
    const std::string bytes(size, 'x');
    const absl::string_view part = bytes;
    const int rounds = size >= (64 << 20) ? std::max(10, iterations / 20) : iterations;
    std::vector<double> one_way_us;
    for (int i = 0; i < rounds + 5; ++i) {
      const absl::Time start = absl::Now();
      if (!(*link)->Send(kPing, {&part, 1}).ok()) return 1;
      auto echo = (*link)->Receive(absl::Now() + absl::Seconds(60));
      if (!echo.ok()) return 1;
      if (i >= 5) one_way_us.push_back(absl::ToDoubleMicroseconds(absl::Now() - start) / 2);
    }
    std::sort(one_way_us.begin(), one_way_us.end());
    const double p50 = one_way_us[one_way_us.size() / 2];
    const double p99 = one_way_us[std::min(one_way_us.size() - 1, one_way_us.size() * 99 / 100)];
    const absl::Time start = absl::Now();
    for (int i = 0; i < rounds; ++i) {
      if (!(*link)->Send(kBulk, {&part, 1}).ok()) return 1;
    }
    if (!(*link)->Send(kAck, {}).ok()) return 1;
    auto ack = (*link)->Receive(absl::Now() + absl::Seconds(120));
    if (!ack.ok()) return 1;
    const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
    const double gib_per_s = static_cast<double>(size) * rounds / seconds / (1 << 30);
    std::printf("%10zu %11.1f us %11.1f us %9.2f GiB/s\n", size, p50, p99, gib_per_s);
  }
  (*link)->Send(kStop, {}).IgnoreError();
  int status = 0;
  waitpid(child, &status, 0);
  return 0;
}

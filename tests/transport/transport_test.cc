// transport/transport.h over real UCX on loopback. Where a peer's death or its own UCX matters, the peer is
// a child process forked at the start of the test, before this process starts UCX for it; children report back
// through pipes (a child cannot use gtest's assertions) and exit with _exit.
#include "transport/transport.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <fstream>
#include <functional>
#include <future>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "transport/peer_filter.h"

namespace strata::transport {
namespace {

constexpr char kSecret[] = "the group secret";
constexpr char kHost[] = "127.0.0.1";
constexpr uint32_t kStop = 0xdead;

TransportOptions Options(int rank, int group_size, std::string secret = kSecret) {
  TransportOptions options;
  options.rank = rank;
  options.group_size = group_size;
  options.secret = std::move(secret);
  options.facts = {{"strata version", "test"}, {"model", "sha256:aa"}};
  options.bind_host = kHost;
  return options;
}

absl::Time In(absl::Duration d) { return absl::Now() + d; }

std::string Pattern(size_t size, uint32_t seed) {
  std::string bytes(size, '\0');
  for (size_t i = 0; i < size; ++i) bytes[i] = static_cast<char>((i * 131 + seed * 7 + (i >> 12)) & 0xff);
  return bytes;
}

double CpuSeconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_utime.tv_sec + usage.ru_stime.tv_sec + (usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6;
}

// One line from `fd`, waiting at most `timeout`.
std::optional<std::string> ReadLine(int fd, absl::Duration timeout) {
  const absl::Time deadline = In(timeout);
  std::string line;
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    const int wait_ms = static_cast<int>(std::max<int64_t>(0, absl::ToInt64Milliseconds(deadline - absl::Now())));
    if (poll(&p, 1, wait_ms) <= 0) return std::nullopt;
    char c;
    if (read(fd, &c, 1) != 1) return std::nullopt;
    if (c == '\n') return line;
    line += c;
  }
}

void WriteLine(int fd, const std::string& line) {
  const std::string text = line + "\n";
  [[maybe_unused]] ssize_t n = write(fd, text.data(), text.size());
}

// A peer in its own process. `body` runs in the child with the child's ends of two pipes and returns "" for
// success or what went wrong.
class Child {
 public:
  using Body = std::function<std::string(Child&)>;
  explicit Child(Body body) {
    int to_child[2], to_parent[2];
    if (pipe(to_child) != 0 || pipe(to_parent) != 0) std::abort();
    std::fflush(nullptr);
    pid_ = fork();
    if (pid_ == 0) {
      close(to_child[1]);
      close(to_parent[0]);
      in_ = to_child[0];
      out_ = to_parent[1];
      std::string result = body(*this);
      WriteLine(out_, "result:" + result);
      _exit(result.empty() ? 0 : 1);
    }
    close(to_child[0]);
    close(to_parent[1]);
    in_ = to_parent[0];
    out_ = to_child[1];
  }
  ~Child() {
    if (pid_ > 0 && !joined_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    close(in_);
    close(out_);
  }

  // Either side: the other side's next line.
  std::optional<std::string> Read(absl::Duration timeout = absl::Seconds(30)) { return ReadLine(in_, timeout); }
  void Write(const std::string& line) { WriteLine(out_, line); }
  int ReadInt() {
    auto line = Read();
    int value = -1;
    if (!line || !absl::SimpleAtoi(*line, &value)) return -1;
    return value;
  }

  // Parent: the child's result ("" when it succeeded), after it exits.
  std::string Join(absl::Duration timeout = absl::Seconds(60)) {
    std::string result = "no result (the child died or timed out)";
    const absl::Time deadline = In(timeout);
    while (auto line = ReadLine(in_, deadline - absl::Now())) {
      if (absl::StartsWith(*line, "result:")) {
        result = line->substr(7);
        break;
      }
    }
    int status = 0;
    for (;;) {
      const pid_t done = waitpid(pid_, &status, WNOHANG);
      if (done == pid_) break;
      if (absl::Now() > deadline) {
        kill(pid_, SIGKILL);
        waitpid(pid_, &status, 0);
        result += " (killed: still running)";
        break;
      }
      absl::SleepFor(absl::Milliseconds(10));
    }
    joined_ = true;
    return result;
  }
  void Kill() { kill(pid_, SIGKILL); }
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  int in_ = -1, out_ = -1;
  bool joined_ = false;
};

#define CHILD_EXPECT(cond, what) \
  if (!(cond)) return std::string(what)

// The child's half of most tests: rank `rank` connects to rank 0 at the port the parent writes.
absl::StatusOr<std::pair<std::unique_ptr<Transport>, std::shared_ptr<Link>>> ConnectToParent(Child& child,
                                                                                             TransportOptions options) {
  const int port = child.ReadInt();
  auto transport = Transport::Start(options);
  if (!transport.ok()) return transport.status();
  auto link = (*transport)->Connect(0, kHost, port, In(absl::Seconds(30)));
  if (!link.ok()) return link.status();
  return std::make_pair(*std::move(transport), *std::move(link));
}

// The real member of the group in the refusal tests: connects, says "member", waits for the parent's word.
std::string SayHelloAndWait(Child& self) {
  auto peer = ConnectToParent(self, Options(1, 2));
  CHILD_EXPECT(peer.ok(), peer.status().ToString());
  const absl::string_view hello = "member";
  CHILD_EXPECT(peer->second->Send(1, {&hello, 1}).ok(), "send failed");
  auto bye = peer->second->Receive(In(absl::Seconds(30)));
  CHILD_EXPECT(bye.ok(), bye.status().ToString());
  return "";
}

std::string Echo(Child& child) {
  auto peer = ConnectToParent(child, Options(1, 2));
  CHILD_EXPECT(peer.ok(), peer.status().ToString());
  auto& link = peer->second;
  for (;;) {
    auto message = link->Receive(In(absl::Seconds(60)));
    CHILD_EXPECT(message.ok(), message.status().ToString());
    if (message->kind == kStop) break;
    const absl::string_view part = message->bytes;
    absl::Status sent = link->Send(message->kind, {&part, 1});
    CHILD_EXPECT(sent.ok(), sent.ToString());
  }
  return "";
}

// Rank 0 in this process, listening for one child.
std::pair<std::unique_ptr<Transport>, std::shared_ptr<Link>> AcceptChild(Child& child, TransportOptions options) {
  auto transport = Transport::Start(options);
  EXPECT_TRUE(transport.ok()) << transport.status();
  if (!transport.ok()) return {};
  child.Write(std::to_string((*transport)->port()));
  auto link = (*transport)->Accept(1, In(absl::Seconds(30)));
  EXPECT_TRUE(link.ok()) << link.status();
  if (!link.ok()) return {std::move(*transport), nullptr};
  return {std::move(*transport), *std::move(link)};
}

// Two transports in this process, linked.
struct LinkedPair {
  std::unique_ptr<Transport> t0, t1;
  std::shared_ptr<Link> l0, l1;  // l0: rank 0's link to rank 1
};

LinkedPair LinkInProcess(TransportOptions o0 = Options(0, 2), TransportOptions o1 = Options(1, 2)) {
  LinkedPair pair;
  auto t0 = Transport::Start(o0);
  auto t1 = Transport::Start(o1);
  EXPECT_TRUE(t0.ok() && t1.ok());
  if (!t0.ok() || !t1.ok()) return pair;
  pair.t0 = *std::move(t0);
  pair.t1 = *std::move(t1);
  const int port = pair.t0->port();
  auto connect =
      std::async(std::launch::async, [&pair, port] { return pair.t1->Connect(0, kHost, port, In(absl::Seconds(20))); });
  auto accepted = pair.t0->Accept(1, In(absl::Seconds(20)));
  auto connected = connect.get();
  EXPECT_TRUE(accepted.ok()) << accepted.status();
  EXPECT_TRUE(connected.ok()) << connected.status();
  if (accepted.ok()) pair.l0 = *accepted;
  if (connected.ok()) pair.l1 = *connected;
  return pair;
}

TEST(Transport, RoundTripsKindsSizesGatherAndOrder) {
  Child child(Echo);
  auto [transport, link] = AcceptChild(child, Options(0, 2));
  ASSERT_NE(link, nullptr);
  EXPECT_EQ(link->peer_rank(), 1);
  EXPECT_TRUE(absl::StartsWith(link->peer_address(), "127.0.0.1:")) << link->peer_address();

  const size_t sizes[] = {0, 1, 1 << 20, 64 << 20};
  for (size_t i = 0; i < 4; ++i) {
    const std::string bytes = Pattern(sizes[i], static_cast<uint32_t>(i));
    const absl::string_view part = bytes;
    ASSERT_TRUE(link->Send(static_cast<uint32_t>(100 + i), {&part, 1}).ok());
    auto echo = link->Receive(In(absl::Seconds(60)));
    ASSERT_TRUE(echo.ok()) << echo.status();
    EXPECT_EQ(echo->kind, 100 + i);
    ASSERT_EQ(echo->bytes.size(), sizes[i]);
    EXPECT_TRUE(echo->bytes == bytes) << "size " << sizes[i];
  }

  // Gather: parts back to back, an empty one among them.
  const std::string big = Pattern(3 << 20, 9);
  const absl::string_view parts[] = {"head:", "", big, ":tail"};
  ASSERT_TRUE(link->Send(7, parts).ok());
  auto gathered = link->Receive(In(absl::Seconds(30)));
  ASSERT_TRUE(gathered.ok()) << gathered.status();
  EXPECT_EQ(gathered->kind, 7u);
  EXPECT_TRUE(gathered->bytes == absl::StrCat("head:", big, ":tail"));

  // 1000 small messages sent from one thread while this one receives the echoes: order is kept.
  constexpr int kCount = 1000;
  auto sender = std::async(std::launch::async, [link = link] {
    for (int i = 0; i < kCount; ++i) {
      const std::string text = std::to_string(i);
      const absl::string_view part = text;
      absl::Status sent = link->Send(static_cast<uint32_t>(i), {&part, 1});
      if (!sent.ok()) return sent;
    }
    return absl::OkStatus();
  });
  for (int i = 0; i < kCount; ++i) {
    auto echo = link->Receive(In(absl::Seconds(30)));
    ASSERT_TRUE(echo.ok()) << echo.status();
    ASSERT_EQ(echo->kind, static_cast<uint32_t>(i));
    ASSERT_EQ(echo->bytes, std::to_string(i));
  }
  EXPECT_TRUE(sender.get().ok());
  ASSERT_TRUE(link->Send(kStop, {}).ok());
  EXPECT_EQ(child.Join(), "");
}

TEST(Transport, BothDirectionsAtOnceFromTwoThreads) {
  LinkedPair pair = LinkInProcess();
  ASSERT_NE(pair.l0, nullptr);
  ASSERT_NE(pair.l1, nullptr);
  constexpr int kCount = 300;
  auto pump = [](std::shared_ptr<Link> link, uint32_t seed) {
    auto receiver = std::async(std::launch::async, [link, seed] {
      for (int i = 0; i < kCount; ++i) {
        auto m = link->Receive(In(absl::Seconds(30)));
        if (!m.ok()) return m.status();
        const size_t size = (i % 10 == 0) ? (256 << 10) : 64;
        if (m->kind != static_cast<uint32_t>(i) || m->bytes != Pattern(size, (seed ^ 1) + i)) {
          return absl::InternalError(absl::StrCat("message ", i, " differs"));
        }
      }
      return absl::OkStatus();
    });
    for (int i = 0; i < kCount; ++i) {
      const size_t size = (i % 10 == 0) ? (256 << 10) : 64;
      const std::string bytes = Pattern(size, seed + i);
      const absl::string_view part = bytes;
      absl::Status sent = link->Send(static_cast<uint32_t>(i), {&part, 1});
      if (!sent.ok()) return sent;
    }
    return receiver.get();
  };
  auto a = std::async(std::launch::async, pump, pair.l0, 10);
  auto b = std::async(std::launch::async, pump, pair.l1, 11);
  EXPECT_TRUE(a.get().ok());
  EXPECT_TRUE(b.get().ok());
}

TEST(Transport, ThreeProcessGroupWithAWorkerToWorkerLink) {
  Child one([](Child& self) -> std::string {
    const int port0 = self.ReadInt();
    auto t = Transport::Start(Options(1, 3));
    CHILD_EXPECT(t.ok(), t.status().ToString());
    self.Write(std::to_string((*t)->port()));
    auto to0 = (*t)->Connect(0, kHost, port0, In(absl::Seconds(30)));
    CHILD_EXPECT(to0.ok(), to0.status().ToString());
    auto from2 = (*t)->Accept(2, In(absl::Seconds(30)));
    CHILD_EXPECT(from2.ok(), from2.status().ToString());
    CHILD_EXPECT((*from2)->peer_rank() == 2, "rank 2's link names another rank");
    auto hello = (*from2)->Receive(In(absl::Seconds(30)));
    CHILD_EXPECT(hello.ok() && hello->bytes == "1, this is 2", "rank 1 did not hear from rank 2");
    const absl::string_view reply = "2, this is 1";
    CHILD_EXPECT((*from2)->Send(2, {&reply, 1}).ok(), "reply to 2 failed");
    const absl::string_view report = "1 heard 2";
    CHILD_EXPECT((*to0)->Send(1, {&report, 1}).ok(), "report to 0 failed");
    auto bye = (*to0)->Receive(In(absl::Seconds(30)));
    CHILD_EXPECT(bye.ok() && bye->kind == kStop, "no bye from 0");
    return "";
  });
  Child two([](Child& self) -> std::string {
    const int port0 = self.ReadInt();
    const int port1 = self.ReadInt();
    auto t = Transport::Start(Options(2, 3));
    CHILD_EXPECT(t.ok(), t.status().ToString());
    auto to0 = (*t)->Connect(0, kHost, port0, In(absl::Seconds(30)));
    CHILD_EXPECT(to0.ok(), to0.status().ToString());
    auto to1 = (*t)->Connect(1, kHost, port1, In(absl::Seconds(30)));
    CHILD_EXPECT(to1.ok(), to1.status().ToString());
    const absl::string_view hello = "1, this is 2";
    CHILD_EXPECT((*to1)->Send(1, {&hello, 1}).ok(), "hello to 1 failed");
    auto reply = (*to1)->Receive(In(absl::Seconds(30)));
    CHILD_EXPECT(reply.ok() && reply->bytes == "2, this is 1", "rank 2 did not hear from rank 1");
    const absl::string_view report = "2 heard 1";
    CHILD_EXPECT((*to0)->Send(2, {&report, 1}).ok(), "report to 0 failed");
    auto bye = (*to0)->Receive(In(absl::Seconds(30)));
    CHILD_EXPECT(bye.ok() && bye->kind == kStop, "no bye from 0");
    return "";
  });
  auto t = Transport::Start(Options(0, 3));
  ASSERT_TRUE(t.ok()) << t.status();
  const std::string port0 = std::to_string((*t)->port());
  one.Write(port0);
  two.Write(port0);
  const int port1 = one.ReadInt();
  ASSERT_GT(port1, 0);
  two.Write(std::to_string(port1));
  auto l1 = (*t)->Accept(1, In(absl::Seconds(30)));
  auto l2 = (*t)->Accept(2, In(absl::Seconds(30)));
  ASSERT_TRUE(l1.ok()) << l1.status();
  ASSERT_TRUE(l2.ok()) << l2.status();
  auto r1 = (*l1)->Receive(In(absl::Seconds(30)));
  auto r2 = (*l2)->Receive(In(absl::Seconds(30)));
  ASSERT_TRUE(r1.ok()) << r1.status();
  ASSERT_TRUE(r2.ok()) << r2.status();
  EXPECT_EQ(r1->bytes, "1 heard 2");
  EXPECT_EQ(r2->bytes, "2 heard 1");
  EXPECT_TRUE((*l1)->Send(kStop, {}).ok());
  EXPECT_TRUE((*l2)->Send(kStop, {}).ok());
  EXPECT_EQ(one.Join(), "");
  EXPECT_EQ(two.Join(), "");
  EXPECT_EQ((*t)->refused(), 0);
}

// The peer process `child` says `said` over `link`, is told to stop, and ends cleanly.
void ExpectHelloThenStop(Link& link, Child& child, std::string_view said) {
  auto hello = link.Receive(In(absl::Seconds(30)));
  ASSERT_TRUE(hello.ok()) << hello.status();
  EXPECT_EQ(hello->bytes, said);
  EXPECT_TRUE(link.Send(kStop, {}).ok());
  EXPECT_EQ(child.Join(), "");
}

TEST(Transport, WrongSecretIsRefusedAndTheRightPeerStillConnects) {
  Child impostor([](Child& self) -> std::string {
    const int port = self.ReadInt();
    auto t = Transport::Start(Options(1, 2, "not the secret"));
    CHILD_EXPECT(t.ok(), t.status().ToString());
    auto link = (*t)->Connect(0, kHost, port, In(absl::Seconds(30)));
    CHILD_EXPECT(!link.ok(), "the impostor was let in");
    CHILD_EXPECT(link.status().code() == absl::StatusCode::kPermissionDenied, link.status().ToString());
    const std::string expected =
        absl::StrCat("node 0 at 127.0.0.1:", port, " refused this node (rank 1): the group secret differs");
    CHILD_EXPECT(absl::StrContains(link.status().message(), expected), link.status().ToString());
    return "";
  });
  Child member(SayHelloAndWait);
  auto t = Transport::Start(Options(0, 2));
  ASSERT_TRUE(t.ok()) << t.status();
  auto accept = std::async(std::launch::async, [&] { return (*t)->Accept(1, In(absl::Seconds(60))); });
  impostor.Write(std::to_string((*t)->port()));
  EXPECT_EQ(impostor.Join(), "");
  EXPECT_EQ((*t)->refused(), 1);
  member.Write(std::to_string((*t)->port()));
  auto link = accept.get();
  ASSERT_TRUE(link.ok()) << link.status();
  ExpectHelloThenStop(**link, member, "member");
  EXPECT_EQ((*t)->refused(), 1);
}

int RawConnect(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, kHost, &addr.sin_addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// True while the other end keeps `fd` open (what it sent is read and discarded): no EOF, nothing but EAGAIN.
bool StillOpen(int fd) {
  char buffer[4096];
  for (;;) {
    const ssize_t n = recv(fd, buffer, sizeof buffer, MSG_DONTWAIT);
    if (n > 0) continue;
    return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
  }
}

TEST(Transport, GarbageAndSilentTcpClientsDoNotBlockTheListener) {
  Child member(SayHelloAndWait);
  // The order is the check, not a clock: the squatters are held until handshake_timeout, 60 s here, past the
  // Accept's 30 s deadline, so a listener that served them before the member misses the member; and the silent one
  // is still held, unanswered, once the member has joined.
  TransportOptions options = Options(0, 2);
  options.handshake_timeout = absl::Seconds(60);
  auto t = Transport::Start(options);
  ASSERT_TRUE(t.ok()) << t.status();
  const int port = (*t)->port();
  // Garbage, then gone.
  const int garbage = RawConnect(port);
  ASSERT_GE(garbage, 0);
  const std::string noise = Pattern(8192, 3);
  EXPECT_GT(write(garbage, noise.data(), noise.size()), 0);
  close(garbage);
  // A length-like prefix announcing far more than it sends, kept open.
  const int liar = RawConnect(port);
  ASSERT_GE(liar, 0);
  const char huge[] = "\xff\xff\xff\xff\xff\xff\xff\x7f";
  EXPECT_GT(write(liar, huge, 8), 0);
  // Silent, kept open.
  const int silent = RawConnect(port);
  ASSERT_GE(silent, 0);

  const absl::Time start = absl::Now();
  member.Write(std::to_string(port));
  auto link = (*t)->Accept(1, In(absl::Seconds(30)));
  const absl::Duration took = absl::Now() - start;
  ASSERT_TRUE(link.ok()) << link.status() << " (the real peer waited behind the squatters?)";
  EXPECT_TRUE(StillOpen(silent)) << "the silent squatter was dropped before the member joined";
  std::printf("the member joined %s after it was told the port, with the squatters held\n",
              absl::FormatDuration(took).c_str());
  ExpectHelloThenStop(**link, member, "member");
  close(liar);
  close(silent);
}

// True once the other end has closed `fd` (what it sent before is read and discarded), false after `timeout`.
bool ClosedByPeer(int fd, absl::Duration timeout) {
  const absl::Time deadline = In(timeout);
  char buffer[4096];
  while (absl::Now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    const ssize_t n = read(fd, buffer, sizeof buffer);
    if (n <= 0) return true;
  }
  return false;
}

// Waits (generously: the machine may be loaded) until the transport has refused at least `count` connections.
bool RefusedAtLeast(const Transport& t, int64_t count, absl::Duration timeout = absl::Seconds(30)) {
  const absl::Time deadline = In(timeout);
  while (t.refused() < count && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(20));
  return t.refused() >= count;
}

void SendBytes(int fd, const std::string& bytes) {
  EXPECT_EQ(send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL), static_cast<ssize_t>(bytes.size()));
}

std::string BigEndian32(uint32_t n) {
  return std::string{static_cast<char>(n >> 24), static_cast<char>(n >> 16), static_cast<char>(n >> 8),
                     static_cast<char>(n)};
}

// Issue 38: 16 bytes of 0xff on the port aborted the process inside UCX (Debian's UCX 1.13.1 parsed them before
// the handshake). Every stranger's bytes now go to the handshake alone: each connection below is refused and
// counted, and a member still joins.
// A member (SayHelloAndWait) told `t`'s port joins within `wait`, says hello, and is stopped.
void ExpectMemberJoins(Transport& t, Child& member, absl::Duration wait) {
  member.Write(std::to_string(t.port()));
  auto link = t.Accept(1, In(wait));
  ASSERT_TRUE(link.ok()) << link.status();
  ExpectHelloThenStop(**link, member, "member");
}

TEST(Transport, RawBytesOnThePortAreRefusedAndAMemberStillJoins) {
  Child member(SayHelloAndWait);
  auto t = Transport::Start(Options(0, 2));
  ASSERT_TRUE(t.ok()) << t.status();
  const int port = (*t)->port();
  std::vector<std::string> attacks = {
      std::string(16, '\xff'),                            // the reproducer
      Pattern(1000, 7),                                   // noise
      BigEndian32(0),                                     // an empty frame
      BigEndian32(1 << 30),                               // a frame far past the limit
      BigEndian32(70) + std::string(1, '\x02') + "half",  // a frame announced longer than what comes (then EOF)
      BigEndian32(81) + std::string(1, '\x02') + BigEndian32(4) + BigEndian32(1) + BigEndian32(32) +
          std::string(32, 'n') + BigEndian32(32) + std::string(32, 'm'),  // a well-formed proof with a wrong MAC
  };
  std::string tcp_magic = "\x78\x56\x34\x12\xbe\xba\xfe\xca";  // UCX's TCP transport's own magic number
  attacks.push_back(tcp_magic + std::string(64, '\xff'));
  for (const std::string& bytes : attacks) {
    const int fd = RawConnect(port);
    ASSERT_GE(fd, 0);
    SendBytes(fd, bytes);
    shutdown(fd, SHUT_WR);
    EXPECT_TRUE(ClosedByPeer(fd, absl::Seconds(30))) << "a stranger's connection was kept";
    close(fd);
  }
  ASSERT_TRUE(RefusedAtLeast(**t, static_cast<int64_t>(attacks.size())));
  ExpectMemberJoins(**t, member, absl::Seconds(30));
  EXPECT_EQ((*t)->refused(), static_cast<int64_t>(attacks.size()));
}

// Issue 38: raw TCP connections that say nothing were held for good. They are dropped at the handshake deadline.
TEST(Transport, SilentSquatterIsDroppedAtTheHandshakeDeadline) {
  TransportOptions options = Options(0, 2);
  options.handshake_timeout = absl::Milliseconds(300);
  auto t = Transport::Start(options);
  ASSERT_TRUE(t.ok()) << t.status();
  const int silent = RawConnect((*t)->port());
  ASSERT_GE(silent, 0);
  EXPECT_TRUE(ClosedByPeer(silent, absl::Seconds(30))) << "the squatter was not dropped";
  close(silent);
  EXPECT_TRUE(RefusedAtLeast(**t, 1));
}

// The cap on connections in the handshake: past it the oldest goes, and a member still gets in (the member's own
// connection drops a squatter; were the member dropped, its Connect would retry).
TEST(Transport, PendingConnectionCapDropsTheOldestAndAMemberStillJoins) {
  constexpr int kCap = 4, kSquatters = 10;
  Child member(SayHelloAndWait);
  TransportOptions options = Options(0, 2);
  options.max_pending_connections = kCap;
  options.handshake_timeout = absl::Seconds(120);  // only the cap drops anyone here
  auto t = Transport::Start(options);
  ASSERT_TRUE(t.ok()) << t.status();
  std::vector<int> squatters;
  for (int i = 0; i < kSquatters; ++i) {
    squatters.push_back(RawConnect((*t)->port()));
    ASSERT_GE(squatters.back(), 0);
  }
  ASSERT_TRUE(RefusedAtLeast(**t, kSquatters - kCap));
  for (int i = 0; i < kSquatters - kCap; ++i) {
    EXPECT_TRUE(ClosedByPeer(squatters[i], absl::Seconds(30))) << "squatter " << i << " (among the oldest) is held";
  }
  ExpectMemberJoins(**t, member, absl::Seconds(60));
  EXPECT_GE((*t)->refused(), kSquatters - kCap + 1);
  for (int fd : squatters) close(fd);
}

// The socket inodes of this process's open file descriptors.
std::set<std::string> OwnSocketInodes() {
  std::set<std::string> inodes;
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return inodes;
  while (dirent* entry = readdir(dir)) {
    char target[256];
    const std::string path = absl::StrCat("/proc/self/fd/", entry->d_name);
    const ssize_t n = readlink(path.c_str(), target, sizeof target - 1);
    if (n <= 0) continue;
    const std::string link(target, static_cast<size_t>(n));
    if (absl::StartsWith(link, "socket:[")) inodes.insert(link.substr(8, link.size() - 9));
  }
  closedir(dir);
  return inodes;
}

// Issue 38: with bind_host 127.0.0.1, UCX's TCP transport still listened on the external interface. Every TCP
// socket this process listens on (strata's port and UCX's own) is bound to the loopback address.
TEST(Transport, EveryListeningSocketIsBoundToTheBindHost) {
  LinkedPair pair = LinkInProcess();
  ASSERT_NE(pair.l0, nullptr);
  const std::set<std::string> inodes = OwnSocketInodes();
  int listening = 0;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // the header
    while (std::getline(in, line)) {
      std::vector<std::string> columns = absl::StrSplit(line, ' ', absl::SkipEmpty());
      if (columns.size() < 10 || columns[3] != "0A" || inodes.count(columns[9]) == 0) continue;  // 0A: LISTEN
      ++listening;
      const std::string host = columns[1].substr(0, columns[1].find(':'));
      // 127.0.0.1 as /proc writes it (little-endian hex), or ::1 / ::ffff:127.0.0.1 in the IPv6 table.
      EXPECT_TRUE(host == "0100007F" || host == "00000000000000000000000001000000" ||
                  host == "0000000000000000FFFF00000100007F")
          << table << ": a socket listens on " << columns[1] << ", not on 127.0.0.1";
    }
  }
  EXPECT_GE(listening, 2);  // both transports' ports, and whatever UCX opened
}

// Whether a TCP connection from `source` (a loopback address) to 127.0.0.1:`port` is established within `timeout`.
bool ConnectsFrom(const char* source, int port, absl::Duration timeout) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  sockaddr_in from{};
  from.sin_family = AF_INET;
  inet_pton(AF_INET, source, &from.sin_addr);
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&from), sizeof from), 0) << source;
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, kHost, &to.sin_addr);
  bool connected = connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof to) == 0;
  if (!connected && errno == EINPROGRESS) {
    pollfd p{fd, POLLOUT, 0};
    int error = 0;
    socklen_t length = sizeof error;
    connected = poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(timeout))) == 1 &&
                getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length) == 0 && error == 0;
  }
  close(fd);
  return connected;
}

// The listening ports of this process other than `own`: UCX's TCP transport's.
std::vector<int> UcxPorts(const std::vector<int>& own) {
  std::vector<int> ports;
  for (int fd : ListeningTcpSockets()) {
    sockaddr_in address{};
    socklen_t length = sizeof address;
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) continue;
    const int port = ntohs(address.sin_port);
    if (std::find(own.begin(), own.end(), port) == own.end()) ports.push_back(port);
  }
  return ports;
}

// Issue 38: UCX's TCP transport listens on a port of its own and parses a stranger's first bytes (its magic
// number and a bad length abort the process). The kernel refuses a connection there from any host but a member's,
// each admitted when it passes strata's handshake: a stranger from 127.0.0.2 never gets a connection, before and
// after the member (from 127.0.0.1) joined, and the member's messages flow.
TEST(Transport, UcxListenersAdmitTheMembersHostsAlone) {
  auto t0 = Transport::Start(Options(0, 2));
  ASSERT_TRUE(t0.ok()) << t0.status();
  const std::vector<int> ucx_ports = UcxPorts({(*t0)->port()});
  ASSERT_FALSE(ucx_ports.empty()) << "UCX opened no TCP listener";
  for (int port : ucx_ports) {
    EXPECT_FALSE(ConnectsFrom("127.0.0.1", port, absl::Milliseconds(500))) << "port " << port << " before any member";
    EXPECT_FALSE(ConnectsFrom("127.0.0.2", port, absl::Milliseconds(500))) << "port " << port;
  }
  auto t1 = Transport::Start(Options(1, 2));
  ASSERT_TRUE(t1.ok()) << t1.status();
  const int port0 = (*t0)->port();
  auto connect = std::async(std::launch::async, [&] { return (*t1)->Connect(0, kHost, port0, In(absl::Seconds(20))); });
  auto l0 = (*t0)->Accept(1, In(absl::Seconds(20)));
  auto l1 = connect.get();
  ASSERT_TRUE(l0.ok()) << l0.status();
  ASSERT_TRUE(l1.ok()) << l1.status();
  const absl::string_view hello = "over UCX";
  ASSERT_TRUE((*l1)->Send(7, {&hello, 1}).ok());
  auto message = (*l0)->Receive(In(absl::Seconds(20)));
  ASSERT_TRUE(message.ok()) << message.status();
  EXPECT_EQ(message->bytes, hello);
  for (int port : ucx_ports) {
    EXPECT_FALSE(ConnectsFrom("127.0.0.2", port, absl::Milliseconds(500))) << "port " << port << " after the join";
  }
}

TEST(Transport, FactsThatDifferFailBothSides) {
  Child other([](Child& self) -> std::string {
    TransportOptions options = Options(1, 3);
    options.facts[1].second = "sha256:bb";
    auto peer = ConnectToParent(self, options);
    CHILD_EXPECT(!peer.ok(), "a node with other facts was let in");
    CHILD_EXPECT(peer.status().code() == absl::StatusCode::kFailedPrecondition, peer.status().ToString());
    const std::string message(peer.status().message());
    CHILD_EXPECT(absl::StrContains(message,
                                   "node 1 differs from node 0: model is \"sha256:bb\" here and "
                                   "\"sha256:aa\" on node 0"),
                 message);
    CHILD_EXPECT(absl::StrContains(message, "group size is \"3\" here and \"2\" on node 0"), message);
    return "";
  });
  auto t = Transport::Start(Options(0, 2));
  ASSERT_TRUE(t.ok()) << t.status();
  other.Write(std::to_string((*t)->port()));
  auto link = (*t)->Accept(1, In(absl::Seconds(30)));
  ASSERT_FALSE(link.ok());
  EXPECT_EQ(link.status().code(), absl::StatusCode::kFailedPrecondition) << link.status();
  EXPECT_TRUE(absl::StrContains(link.status().message(),
                                "node 0 differs from node 1: model is \"sha256:aa\" here and \"sha256:bb\" on node 1"))
      << link.status();
  EXPECT_TRUE(absl::StrContains(link.status().message(), "group size is \"2\" here and \"3\" on node 1"))
      << link.status();
  EXPECT_EQ(other.Join(), "");
}

TEST(Transport, ReceiveDeadlineNamesThePeer) {
  LinkedPair pair = LinkInProcess();
  ASSERT_NE(pair.l0, nullptr);
  const absl::Time start = absl::Now();
  auto message = pair.l0->Receive(In(absl::Seconds(1)));
  const absl::Duration took = absl::Now() - start;
  ASSERT_FALSE(message.ok());
  EXPECT_EQ(message.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(absl::StrContains(message.status().message(), "node 1 (127.0.0.1:")) << message.status();
  EXPECT_TRUE(absl::StrContains(message.status().message(), "no message within 1")) << message.status();
  EXPECT_GE(took, absl::Seconds(1));
  // Ended at its deadline, not by some later timeout: idle, 1.00 s (2026-11-28); 4 s of slack for a machine whose
  // cores are busy elsewhere, or TSan (tests/sanitize) on one.
  EXPECT_LT(took, absl::Seconds(1) + absl::Seconds(4));
}

TEST(Transport, IdleReceiveDoesNotSpin) {
  LinkedPair pair = LinkInProcess();
  ASSERT_NE(pair.l0, nullptr);
  absl::SleepFor(absl::Milliseconds(200));  // let the handshake's last frames settle
  const double before = CpuSeconds();
  auto message = pair.l0->Receive(In(absl::Seconds(2)));
  const double used = CpuSeconds() - before;
  EXPECT_EQ(message.status().code(), absl::StatusCode::kDeadlineExceeded);
  std::printf("CPU time of this process (two transports) during an idle 2 s Receive: %.3f s\n", used);
  EXPECT_LT(used, 0.5);
}

TEST(Transport, CloseMakesBothSidesUnavailable) {
  LinkedPair pair = LinkInProcess();
  ASSERT_NE(pair.l0, nullptr);
  const absl::string_view last = "last";
  ASSERT_TRUE(pair.l1->Send(3, {&last, 1}).ok());
  pair.l1->Close();
  EXPECT_EQ(pair.l1->Send(3, {&last, 1}).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(pair.l1->Receive(In(absl::Seconds(1))).status().code(), absl::StatusCode::kUnavailable);
  // The other side still gets what was sent before the close, then UNAVAILABLE.
  auto first = pair.l0->Receive(In(absl::Seconds(5)));
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->bytes, "last");
  const absl::Time start = absl::Now();
  auto gone = pair.l0->Receive(In(absl::Seconds(30)));
  EXPECT_EQ(gone.status().code(), absl::StatusCode::kUnavailable) << gone.status();
  EXPECT_TRUE(absl::StrContains(gone.status().message(), "node 1 (127.0.0.1:")) << gone.status();
  // UNAVAILABLE, not DEADLINE_EXCEEDED, is the order check (the close was seen before the Receive's 30 s deadline);
  // the clock: within half of it (idle, milliseconds).
  EXPECT_LT(absl::Now() - start, absl::Seconds(15));
  EXPECT_EQ(pair.l0->Send(3, {&last, 1}).code(), absl::StatusCode::kUnavailable);
}

TEST(Transport, PeerClosingEndsAPendingReceive) {
  Child closer([](Child& self) -> std::string {
    auto peer = ConnectToParent(self, Options(1, 2));
    CHILD_EXPECT(peer.ok(), peer.status().ToString());
    CHILD_EXPECT(self.Read().has_value(), "no go");
    absl::SleepFor(absl::Milliseconds(500));
    peer->second->Close();
    absl::SleepFor(absl::Seconds(1));
    return "";
  });
  auto [transport, link] = AcceptChild(closer, Options(0, 2));
  ASSERT_NE(link, nullptr);
  closer.Write("go");
  const absl::Time start = absl::Now();
  auto message = link->Receive(In(absl::Seconds(30)));
  const absl::Duration took = absl::Now() - start;
  EXPECT_EQ(message.status().code(), absl::StatusCode::kUnavailable) << message.status();
  EXPECT_TRUE(absl::StrContains(message.status().message(), "node 1 (127.0.0.1:")) << message.status();
  std::printf("peer close detected %s after the Receive began (the peer closed after 500ms)\n",
              absl::FormatDuration(took).c_str());
  // UNAVAILABLE (not DEADLINE_EXCEEDED) is the order check: the close ended the 30 s Receive; the clock, half of it.
  EXPECT_LT(took, absl::Seconds(15));
  EXPECT_EQ(closer.Join(), "");
}

TEST(Transport, PeerKilledEndsAPendingReceive) {
  Child victim([](Child& self) -> std::string {
    auto peer = ConnectToParent(self, Options(1, 2));
    CHILD_EXPECT(peer.ok(), peer.status().ToString());
    self.Write("linked");
    for (;;) pause();
  });
  auto [transport, link] = AcceptChild(victim, Options(0, 2));
  ASSERT_NE(link, nullptr);
  ASSERT_TRUE(victim.Read().has_value());
  absl::Time killed_at;
  std::thread killer([&] {
    absl::SleepFor(absl::Milliseconds(500));
    killed_at = absl::Now();
    victim.Kill();
  });
  auto message = link->Receive(In(absl::Seconds(30)));
  const absl::Time detected = absl::Now();
  killer.join();
  EXPECT_EQ(message.status().code(), absl::StatusCode::kUnavailable) << message.status();
  EXPECT_TRUE(absl::StrContains(message.status().message(), "node 1 (127.0.0.1:")) << message.status();
  std::printf("SIGKILL of the peer detected after %s\n", absl::FormatDuration(detected - killed_at).c_str());
  // UNAVAILABLE (not DEADLINE_EXCEEDED) is the order check: the kill ended the 30 s Receive; the clock, half of it.
  EXPECT_LT(detected - killed_at, absl::Seconds(15));
  const absl::string_view bytes = "anyone?";
  EXPECT_EQ(link->Send(1, {&bytes, 1}).code(), absl::StatusCode::kUnavailable);
}

// Peak resident memory since the last ResetPeakRss (false where the kernel cannot reset it).
bool ResetPeakRss() {
  std::ofstream clear("/proc/self/clear_refs");
  clear << "5";
  clear.flush();
  return clear.good();
}

int64_t StatusKib(const std::string& field) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (absl::StartsWith(line, field + ":")) {
      int64_t kib = 0;
      std::string digits;
      for (char c : line) {
        if (c >= '0' && c <= '9') digits += c;
      }
      if (absl::SimpleAtoi(digits, &kib)) return kib;
    }
  }
  return -1;
}

TEST(Transport, OversizedMessageIsRefusedWithoutAllocation) {
  constexpr size_t kOversized = size_t{256} << 20;
  Child sender([](Child& self) -> std::string {
    auto peer = ConnectToParent(self, Options(1, 2));
    CHILD_EXPECT(peer.ok(), peer.status().ToString());
    const std::string small(1000, 's');
    const absl::string_view part = small;
    CHILD_EXPECT(peer->second->Send(1, {&part, 1}).ok(), "small send failed");
    const std::string big(kOversized, 'b');
    const absl::string_view big_part = big;
    absl::Status sent = peer->second->Send(2, {&big_part, 1});
    CHILD_EXPECT(!sent.ok(), "the oversized send succeeded");
    return "";
  });
  TransportOptions options = Options(0, 2);
  options.max_message_bytes = 1 << 20;
  auto [transport, link] = AcceptChild(sender, options);
  ASSERT_NE(link, nullptr);
  auto small = link->Receive(In(absl::Seconds(30)));
  ASSERT_TRUE(small.ok()) << small.status();
  EXPECT_EQ(small->bytes.size(), 1000u);
  const bool measured = ResetPeakRss();
  const int64_t rss_before = StatusKib("VmRSS");
  auto big = link->Receive(In(absl::Seconds(30)));
  ASSERT_FALSE(big.ok());
  EXPECT_EQ(big.status().code(), absl::StatusCode::kInvalidArgument) << big.status();
  EXPECT_TRUE(absl::StrContains(big.status().message(), "node 1 (127.0.0.1:")) << big.status();
  EXPECT_TRUE(absl::StrContains(big.status().message(), "268435456 bytes")) << big.status();
  if (measured) {
    const int64_t peak = StatusKib("VmHWM");
    std::printf("peak RSS while refusing a 256 MiB message: %lld KiB over the RSS before\n",
                static_cast<long long>(peak - rss_before));
    EXPECT_LT(peak - rss_before, 64 << 10) << "peak RSS grew by " << (peak - rss_before) << " KiB";
  }
  EXPECT_EQ(link->Receive(In(absl::Seconds(1))).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(sender.Join(), "");
}

TEST(Transport, AcceptDeadlineNamesTheRankAndTheAddress) {
  auto t = Transport::Start(Options(0, 2));
  ASSERT_TRUE(t.ok()) << t.status();
  auto link = (*t)->Accept(1, In(absl::Milliseconds(300)));
  ASSERT_FALSE(link.ok());
  EXPECT_EQ(link.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(absl::StrContains(link.status().message(), "node 1")) << link.status();
  EXPECT_TRUE(absl::StrContains(link.status().message(), absl::StrCat("127.0.0.1:", (*t)->port()))) << link.status();
}

int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  inet_pton(AF_INET, kHost, &addr.sin_addr);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  socklen_t len = sizeof addr;
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

TEST(Transport, ConnectRetriesUntilThePeerListens) {
  Child late([](Child& self) -> std::string {
    auto peer = ConnectToParent(self, Options(1, 2));
    CHILD_EXPECT(peer.ok(), peer.status().ToString());
    const absl::string_view hello = "made it";
    CHILD_EXPECT(peer->second->Send(1, {&hello, 1}).ok(), "send failed");
    auto bye = peer->second->Receive(In(absl::Seconds(30)));
    CHILD_EXPECT(bye.ok(), bye.status().ToString());
    return "";
  });
  TransportOptions options = Options(0, 2);
  options.port = FreePort();
  late.Write(std::to_string(options.port));
  absl::SleepFor(absl::Milliseconds(1500));  // the child is retrying by now
  auto t = Transport::Start(options);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->port(), options.port);
  auto link = (*t)->Accept(1, In(absl::Seconds(30)));
  ASSERT_TRUE(link.ok()) << link.status();
  ExpectHelloThenStop(**link, late, "made it");
}

TEST(Transport, ConnectToNobodyTimesOutNamingTheAddress) {
  auto t = Transport::Start(Options(1, 2));
  ASSERT_TRUE(t.ok()) << t.status();
  const int port = FreePort();
  const absl::Time start = absl::Now();
  auto link = (*t)->Connect(0, kHost, port, In(absl::Seconds(1)));
  ASSERT_FALSE(link.ok());
  EXPECT_EQ(link.status().code(), absl::StatusCode::kDeadlineExceeded) << link.status();
  EXPECT_TRUE(absl::StrContains(link.status().message(), absl::StrCat("node 0 at 127.0.0.1:", port))) << link.status();
  // At its 1 s deadline, not later (idle: 1.0 s); 4 s of slack for busy cores or TSan.
  EXPECT_LT(absl::Now() - start, absl::Seconds(1) + absl::Seconds(4));
}

TEST(Transport, DestroyedWithLinksOpen) {
  LinkedPair pair = LinkInProcess();
  ASSERT_NE(pair.l0, nullptr);
  auto pending = std::async(std::launch::async, [l0 = pair.l0] { return l0->Receive(In(absl::Seconds(30))); });
  absl::SleepFor(absl::Milliseconds(100));
  pair.t0.reset();
  EXPECT_EQ(pending.get().status().code(), absl::StatusCode::kUnavailable);
  const absl::string_view bytes = "x";
  EXPECT_EQ(pair.l0->Send(1, {&bytes, 1}).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(pair.l1->Receive(In(absl::Seconds(10))).status().code(), absl::StatusCode::kUnavailable);
  pair.t1.reset();
  EXPECT_EQ(pair.l1->Send(1, {&bytes, 1}).code(), absl::StatusCode::kUnavailable);
}

TEST(Transport, StartRejectsAnEmptySecret) {
  auto t = Transport::Start(Options(0, 2, ""));
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace strata::transport

#pragma once
// server::MetricsEndpoint: serves GET /metrics (Prometheus text format, via prometheus-cpp's
// TextSerializer) from its own thread.
//
// Why not prometheus-cpp's Exposer: it runs on civetweb, whose threads Debian's build starts with
// 100 KiB stacks (civetweb's compile-time USE_STACK_SIZE). glibc puts every thread's static TLS in its
// stack, and once the torch wheel's CUDA libraries are loaded (cuBLASLt alone has 94 KiB of static
// TLS) no civetweb thread can start: the Exposer fails with "null context when constructing
// CivetServer". This endpoint's thread has the default stack.

#include <atomic>
#include <memory>
#include <thread>

#include "absl/status/statusor.h"
#include "prometheus/registry.h"
#include "server/flags.h"

namespace strata::server {

class MetricsEndpoint {
 public:
  // Binds `address` (Unavailable when it cannot: a port in use) and serves `registry` until destroyed.
  static absl::StatusOr<std::unique_ptr<MetricsEndpoint>> Start(const ListenAddress& address,
                                                                std::shared_ptr<prometheus::Registry> registry);
  ~MetricsEndpoint();
  MetricsEndpoint(const MetricsEndpoint&) = delete;
  MetricsEndpoint& operator=(const MetricsEndpoint&) = delete;

  // The port bound (the one the system picked when asked for port 0).
  int port() const { return port_; }

 private:
  MetricsEndpoint(int listen_fd, int port, std::shared_ptr<prometheus::Registry> registry);
  void Serve();
  void Answer(int connection) const;

  const int listen_fd_;
  const int port_;
  std::shared_ptr<prometheus::Registry> registry_;
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

}  // namespace strata::server

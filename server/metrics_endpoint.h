#pragma once
// server::MetricsEndpoint: serves GET /metrics (Prometheus text format, via prometheus-cpp's
// TextSerializer) and GET /health (200 while serving, else 503: the HTTP API's /health on a port of its own,
// which a flood of the API's connections does not reach) with GNU libmicrohttpd: one internal thread polling every
// connection with epoll, so a client that trickles its request (or never finishes it) holds one connection slot, not
// the endpoint. Limits: at most kMaxConnections connections at once (more are refused at accept), an idle connection is
// closed after kIdleTimeoutSeconds, a request head of more than MHD's memory pool is answered 431.
//
// Why not prometheus-cpp's Exposer: it runs on civetweb, whose threads Debian's build starts with
// 100 KiB stacks (civetweb's compile-time USE_STACK_SIZE). glibc puts every thread's static TLS in its
// stack, and once the torch wheel's CUDA libraries are loaded (cuBLASLt alone has 94 KiB of static
// TLS) no civetweb thread can start ("null context when constructing CivetServer"). libmicrohttpd takes
// the thread's stack size as an option (kThreadStackBytes).

#include <microhttpd.h>

#include <atomic>
#include <memory>

#include "absl/status/statusor.h"
#include "prometheus/registry.h"
#include "server/flags.h"

namespace strata::server {

class MetricsEndpoint {
 public:
  static constexpr unsigned kMaxConnections = 512;
  static constexpr unsigned kIdleTimeoutSeconds = 10;
  static constexpr size_t kThreadStackBytes = 8 << 20;

  // Binds `address` (Unavailable when it cannot: a port in use) and serves `registry` until destroyed.
  static absl::StatusOr<std::unique_ptr<MetricsEndpoint>> Start(const ListenAddress& address,
                                                                std::shared_ptr<prometheus::Registry> registry);
  // Stops the thread and closes every connection (slow ones included) at once.
  ~MetricsEndpoint();
  MetricsEndpoint(const MetricsEndpoint&) = delete;
  MetricsEndpoint& operator=(const MetricsEndpoint&) = delete;

  // The port bound (the one the system picked when asked for port 0).
  int port() const { return port_; }
  // What GET /health answers: 200 while serving, 503 otherwise (loading, draining, a lost device).
  void SetServing(bool serving) { serving_.store(serving); }

 private:
  explicit MetricsEndpoint(std::shared_ptr<prometheus::Registry> registry) : registry_(std::move(registry)) {}
  static MHD_Result Answer(void* endpoint_ptr, MHD_Connection* connection, const char* url, const char* method,
                           const char* version, const char* upload_data, size_t* upload_data_size,
                           void** request_state);

  std::shared_ptr<prometheus::Registry> registry_;
  std::atomic<bool> serving_{false};
  MHD_Daemon* daemon_ = nullptr;
  int port_ = 0;
};

}  // namespace strata::server

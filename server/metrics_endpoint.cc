#include "server/metrics_endpoint.h"

#include <microhttpd.h>
#include <sys/socket.h>

#include <cstring>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "prometheus/text_serializer.h"
#include "server/http_server.h"

namespace strata::server {
namespace {

MHD_Result Reply(MHD_Connection* connection, unsigned status, const char* content_type, const std::string& body) {
  MHD_Response* response =
      MHD_create_response_from_buffer(body.size(), const_cast<char*>(body.data()), MHD_RESPMEM_MUST_COPY);
  if (response == nullptr) return MHD_NO;
  MHD_add_response_header(response, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
  const MHD_Result queued = MHD_queue_response(connection, status, response);
  MHD_destroy_response(response);
  return queued;
}

}  // namespace

// One call per request (a scrape has no body; a request with one is refused before it is read). HEAD is
// answered as GET without the body by MHD itself.
MHD_Result MetricsEndpoint::Answer(void* endpoint_ptr, MHD_Connection* connection, const char* url, const char* method,
                                   const char* /*version*/, const char* /*upload_data*/, size_t* /*upload_data_size*/,
                                   void** /*request_state*/) {
  const auto& endpoint = *static_cast<const MetricsEndpoint*>(endpoint_ptr);
  if (std::strcmp(method, MHD_HTTP_METHOD_GET) != 0 && std::strcmp(method, MHD_HTTP_METHOD_HEAD) != 0) {
    return Reply(connection, MHD_HTTP_METHOD_NOT_ALLOWED, "text/plain", "only GET /metrics and /health\n");
  }
  if (std::strcmp(url, "/health") == 0) {
    return Reply(connection, endpoint.serving_.load() ? MHD_HTTP_OK : MHD_HTTP_SERVICE_UNAVAILABLE, "text/plain", "");
  }
  if (std::strcmp(url, "/metrics") != 0) {
    return Reply(connection, MHD_HTTP_NOT_FOUND, "text/plain", "strata serves /metrics and /health\n");
  }
  return Reply(connection, MHD_HTTP_OK, "text/plain; version=0.0.4; charset=utf-8",
               prometheus::TextSerializer().Serialize(endpoint.registry_->Collect()));
}

absl::StatusOr<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::Start(
    const ListenAddress& address, std::shared_ptr<prometheus::Registry> registry) {
  absl::StatusOr<std::vector<sockaddr_storage>> addresses = ResolveListenAddress(address, "--metrics-listen");
  if (!addresses.ok()) return addresses.status();
  std::unique_ptr<MetricsEndpoint> endpoint(new MetricsEndpoint(std::move(registry)));
  for (const sockaddr_storage& a : *addresses) {
    unsigned flags = MHD_USE_EPOLL_INTERNAL_THREAD;
    if (a.ss_family == AF_INET6) flags |= MHD_USE_IPv6;
    endpoint->daemon_ = MHD_start_daemon(
        flags, static_cast<uint16_t>(address.port), nullptr, nullptr, &Answer, endpoint.get(), MHD_OPTION_SOCK_ADDR, &a,
        MHD_OPTION_CONNECTION_LIMIT, kMaxConnections, MHD_OPTION_CONNECTION_TIMEOUT, kIdleTimeoutSeconds,
        MHD_OPTION_THREAD_STACK_SIZE, kThreadStackBytes, MHD_OPTION_LISTEN_BACKLOG_SIZE, 128u, MHD_OPTION_END);
    if (endpoint->daemon_ != nullptr) break;
  }
  if (endpoint->daemon_ == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve /metrics on ", address.ToString(), " (port in use or address not local?)"));
  }
  const MHD_DaemonInfo* info = MHD_get_daemon_info(endpoint->daemon_, MHD_DAEMON_INFO_BIND_PORT);
  endpoint->port_ = info != nullptr ? info->port : address.port;
  return endpoint;
}

MetricsEndpoint::~MetricsEndpoint() {
  if (daemon_ != nullptr) MHD_stop_daemon(daemon_);
}

}  // namespace strata::server

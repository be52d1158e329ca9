#pragma once
// server::Metrics: the Prometheus registry (prometheus-cpp) and its /metrics endpoint.

#include <memory>

#include "absl/status/statusor.h"
#include "planner/plan.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/registry.h"
#include "server/flags.h"
#include "server/metrics_endpoint.h"

namespace strata::server {

class Metrics {
 public:
  // Serves /metrics on `address`. Unavailable when the address cannot be bound (a port in use).
  static absl::StatusOr<std::unique_ptr<Metrics>> Start(const ListenAddress& address);

  // Publishes, per device of the plan, its budget, its planned bytes and its KV cache reserve.
  void RecordPlan(const planner::Plan& plan);

  // The address /metrics is served on, with the port the system picked when asked for port 0.
  const ListenAddress& address() const { return address_; }

 private:
  Metrics(ListenAddress address, std::shared_ptr<prometheus::Registry> registry,
          std::unique_ptr<MetricsEndpoint> endpoint);

  ListenAddress address_;
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<MetricsEndpoint> endpoint_;
  prometheus::Family<prometheus::Gauge>& device_budget_bytes_;
  prometheus::Family<prometheus::Gauge>& device_planned_bytes_;
  prometheus::Family<prometheus::Gauge>& device_kv_cache_bytes_;
};

}  // namespace strata::server

#include "server/metrics.h"

#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace strata::server {

absl::StatusOr<std::unique_ptr<Metrics>> Metrics::Start(const ListenAddress& address) {
  auto registry = std::make_shared<prometheus::Registry>();
  absl::StatusOr<std::unique_ptr<MetricsEndpoint>> endpoint = MetricsEndpoint::Start(address, registry);
  if (!endpoint.ok()) return endpoint.status();
  ListenAddress bound = address;
  bound.port = (*endpoint)->port();
  return std::unique_ptr<Metrics>(new Metrics(std::move(bound), std::move(registry), *std::move(endpoint)));
}

Metrics::Metrics(ListenAddress address, std::shared_ptr<prometheus::Registry> registry,
                 std::unique_ptr<MetricsEndpoint> endpoint)
    : address_(std::move(address)),
      registry_(std::move(registry)),
      endpoint_(std::move(endpoint)),
      device_budget_bytes_(prometheus::BuildGauge()
                               .Name("strata_device_budget_bytes")
                               .Help("Memory budget of a device (max_memory after balancing), in bytes")
                               .Register(*registry_)),
      device_planned_bytes_(prometheus::BuildGauge()
                                .Name("strata_device_planned_bytes")
                                .Help("Bytes of weights the plan places on a device")
                                .Register(*registry_)),
      device_kv_cache_bytes_(prometheus::BuildGauge()
                                 .Name("strata_device_kv_cache_bytes")
                                 .Help("KV cache bytes the plan reserves on a device")
                                 .Register(*registry_)) {}

void Metrics::RecordPlan(const planner::Plan& plan) {
  for (const planner::DeviceUsage& usage : plan.devices) {
    const prometheus::Labels labels{{"device", usage.device.ToString()}};
    device_budget_bytes_.Add(labels).Set(usage.budget_bytes);
    device_planned_bytes_.Add(labels).Set(static_cast<double>(usage.planned_bytes));
    device_kv_cache_bytes_.Add(labels).Set(static_cast<double>(usage.kv_cache_bytes));
  }
}

}  // namespace strata::server

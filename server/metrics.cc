#include "server/metrics.h"

#include <exception>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace strata::server {

absl::StatusOr<std::unique_ptr<Metrics>> Metrics::Start(const ListenAddress& address) {
  std::unique_ptr<prometheus::Exposer> exposer;
  try {
    // civetweb reads "HOST:PORT" as a listening address.
    exposer = std::make_unique<prometheus::Exposer>(address.ToString());
  } catch (const std::exception& e) {
    // prometheus-cpp reports a failed bind by throwing from civetweb's constructor.
    return absl::UnavailableError(
        absl::StrCat("cannot serve /metrics on ", address.ToString(), " (port in use?): ", e.what()));
  }
  ListenAddress bound = address;
  if (std::vector<int> ports = exposer->GetListeningPorts(); !ports.empty()) bound.port = ports.front();
  return std::unique_ptr<Metrics>(new Metrics(std::move(bound), std::move(exposer)));
}

Metrics::Metrics(ListenAddress address, std::unique_ptr<prometheus::Exposer> exposer)
    : address_(std::move(address)),
      registry_(std::make_shared<prometheus::Registry>()),
      exposer_(std::move(exposer)),
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
                                 .Register(*registry_)) {
  exposer_->RegisterCollectable(registry_);
}

void Metrics::RecordPlan(const planner::Plan& plan) {
  for (const planner::DeviceUsage& usage : plan.devices) {
    const prometheus::Labels labels{{"device", usage.device.ToString()}};
    device_budget_bytes_.Add(labels).Set(usage.budget_bytes);
    device_planned_bytes_.Add(labels).Set(static_cast<double>(usage.planned_bytes));
    device_kv_cache_bytes_.Add(labels).Set(static_cast<double>(usage.kv_cache_bytes));
  }
}

}  // namespace strata::server

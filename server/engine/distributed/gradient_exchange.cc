#include "server/engine/distributed/gradient_exchange.h"

#include <stdexcept>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace trainerd::engine {

void GroupGradientExchange::Exchange(const std::vector<torch::Tensor>& gradients, int64_t rows) {
  // The gradients live on the rank's device; Gloo all-reduces CPU tensors. (A GPU rank's group is
  // NCCL's, on the device, which is not wired yet.)
  const bool on_cpu = gradients.empty() || gradients.front().device().is_cpu();
  if (!on_cpu) {
    throw std::runtime_error("a data-parallel rank on a GPU needs an NCCL group (not yet here)");
  }
  const absl::Status status = group_.AllReduceRowWeightedMean(gradients, rows);
  if (!status.ok()) throw std::runtime_error(std::string(status.message()));
  ++exchanges_;
}

}  // namespace trainerd::engine

// The training paths' gradient exchange (training/training_path.h) on a c10d group: a
// data-parallel rank's gradients combined with the other ranks' every step, in one all-reduce.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <vector>

#include "server/engine/distributed/collectives.h"
#include "server/engine/training/training_path.h"

namespace trainerd::engine {

// Each step's gradients, rows-weighted over the ranks of `group`
// (CpuGroup::AllReduceRowWeightedMean: one flat bucket, one all-reduce). Throws std::runtime_error
// with the group's sentence when the ranks cannot combine, which fails the job. `group` outlives
// it; used on the rank's thread.
class GroupGradientExchange final : public GradientExchange {
 public:
  explicit GroupGradientExchange(CpuGroup& group) : group_(group) {}
  void Exchange(const std::vector<torch::Tensor>& gradients, int64_t rows) override;
  int64_t exchanges() const { return exchanges_; }

 private:
  CpuGroup& group_;
  int64_t exchanges_ = 0;
};

}  // namespace trainerd::engine

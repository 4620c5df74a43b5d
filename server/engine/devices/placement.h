// Where a job that names no device runs, when the daemon has several GPUs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace trainerd::engine {

// One device a job could run on, as the engine sees it at submit.
struct PlacementCandidate {
  std::string device;           // "cuda:N"
  bool holds_datasets = false;  // the job's datasets are resident there now
  int64_t jobs = 0;             // its queued and running jobs
  int64_t free_memory = -1;     // its memory budget left (bytes), or -1 without a budget
};

// The index of the device the job goes to: the least loaded of the devices that hold its
// datasets, or, when none does (or those that do have no room left for `need` bytes), the least
// loaded of all; "least loaded" is the fewest queued and running jobs, then the most free memory,
// then the lowest index (so that a quiet daemon keeps to cuda:0). `need` is the job's estimated
// working set. Requires a non-empty list.
size_t ChooseDevice(const std::vector<PlacementCandidate>& candidates, int64_t need);

}  // namespace trainerd::engine

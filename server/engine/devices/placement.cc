#include "server/engine/devices/placement.h"

#include <tuple>

namespace trainerd::engine {
namespace {

bool HasRoom(const PlacementCandidate& c, int64_t need) {
  return c.free_memory < 0 || c.free_memory >= need;
}

// True when a is less loaded than b (fewer jobs, then more free memory; no budget counts as the
// most).
bool LessLoaded(const PlacementCandidate& a, const PlacementCandidate& b) {
  const auto key = [](const PlacementCandidate& c) {
    return std::make_tuple(c.jobs, c.free_memory < 0 ? 0 : 1, -c.free_memory);
  };
  return key(a) < key(b);
}

}  // namespace

size_t ChooseDevice(const std::vector<PlacementCandidate>& candidates, int64_t need) {
  size_t best = candidates.size();
  // First choice: a device that holds the datasets (no copy, no load) and has room.
  for (size_t i = 0; i < candidates.size(); ++i) {
    const PlacementCandidate& c = candidates[i];
    if (!c.holds_datasets || !HasRoom(c, need)) continue;
    if (best == candidates.size() || LessLoaded(c, candidates[best])) best = i;
  }
  if (best != candidates.size()) return best;
  // Else the least loaded device with room, else the least loaded of all (the job then waits
  // there for memory, as it would anywhere).
  for (bool require_room : {true, false}) {
    for (size_t i = 0; i < candidates.size(); ++i) {
      const PlacementCandidate& c = candidates[i];
      if (require_room && !HasRoom(c, need)) continue;
      if (best == candidates.size() || LessLoaded(c, candidates[best])) best = i;
    }
    if (best != candidates.size()) return best;
  }
  return 0;
}

}  // namespace trainerd::engine

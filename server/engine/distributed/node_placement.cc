#include "server/engine/distributed/node_placement.h"

#include "absl/strings/str_cat.h"

namespace trainerd::engine {

std::string NodeOf(const std::vector<std::string>& nodes, int64_t index) {
  if (nodes.empty() || index < 0) return "";
  const size_t slot = static_cast<size_t>(index) % (nodes.size() + 1);
  return slot == 0 ? "" : nodes[slot - 1];
}

std::string NodeDatasetName(const DatasetMeta& meta, const std::string& submitter) {
  if (meta.owner == submitter) return absl::StrCat(submitter, "/", meta.name);
  constexpr size_t kMaxName = 128;  // ValidateDatasetName's
  return absl::StrCat(submitter, "/", meta.name.substr(0, kMaxName - 17), "-",
                      meta.sha256.substr(0, 16));
}

}  // namespace trainerd::engine

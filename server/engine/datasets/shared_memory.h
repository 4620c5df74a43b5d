// Host memory that a worker process can map without a copy: a CPU dataset's bytes live in an
// anonymous memory file (memfd) mapped into the daemon, so that a TorchScript job's worker
// (server/worker/) maps the same pages read-only instead of receiving a second copy.
//
// The daemon allocates with AllocateSharedHostBytes; FindSharedRegion finds the region a tensor's
// bytes lie in and ReadOnlyDescriptor makes the descriptor the worker gets: a second open of the
// memory file with O_RDONLY, through which the worker can neither write nor map for writing.
// Thread-safe.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"

namespace trainerd::engine {

// A uint8 CPU tensor of `bytes` bytes backed by a memory file (MAP_SHARED); its pages are
// committed as they are written, as for an ordinary allocation. `name` names the file in
// /proc/<pid>/fd. RESOURCE_EXHAUSTED when the memory file or its mapping cannot be made.
absl::StatusOr<torch::Tensor> AllocateSharedHostBytes(int64_t bytes, const std::string& name);

// The region of shared host memory that holds `data` .. `data + bytes`, if any.
struct SharedRegion {
  int fd = -1;  // the daemon's own read-write descriptor (do not close)
  const void* base = nullptr;
  int64_t size = 0;
  int64_t offset = 0;  // of `data` from `base`
};
std::optional<SharedRegion> FindSharedRegion(const void* data, int64_t bytes);

// A new read-only descriptor of the region's memory file (the caller closes it), or -1 with errno.
int ReadOnlyDescriptor(const SharedRegion& region);

// The worker's side: maps `size` bytes of a read-only descriptor (PROT_READ, MAP_SHARED) and
// returns them as a uint8 tensor that unmaps when its last view goes. Takes ownership of `fd`.
absl::StatusOr<torch::Tensor> MapReadOnly(int fd, int64_t size);

}  // namespace trainerd::engine

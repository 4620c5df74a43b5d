// Host memory that a worker process can map without a copy: a CPU dataset's bytes live in an
// anonymous memory file (memfd) mapped into the daemon, so that a TorchScript job's worker
// (server/worker/) maps the same pages read-only instead of receiving a second copy.
//
// The daemon allocates with AllocateSharedHostBytes (a memory file of mode 0400) and fills the
// bytes; FindSharedRegion finds the region a tensor's bytes lie in and ReadOnlyDescriptor makes the
// descriptor the worker gets: the file is first sealed against writes, new writable mappings and
// size changes (the daemon's own mapping stays as it is), then opened a second time with O_RDONLY.
// So a worker can neither write the bytes through its descriptor nor through any reopening of it
// (/proc/self/fd/N with O_RDWR: refused by the mode, and powerless against the seals where it is
// allowed), and cannot truncate the file under the daemon's feet. A region must therefore be filled
// before its first read-only descriptor is made. Thread-safe.
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
// Seals the file first (see above): the daemon must not write the region afterwards.
int ReadOnlyDescriptor(const SharedRegion& region);

// The worker's side: maps `size` bytes of a read-only descriptor (PROT_READ, MAP_SHARED) and
// returns them as a uint8 tensor that unmaps when its last view goes. Takes ownership of `fd`.
absl::StatusOr<torch::Tensor> MapReadOnly(int fd, int64_t size);

}  // namespace trainerd::engine

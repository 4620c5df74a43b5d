// Placement: where a job's ranks, or a spread sweep's members, go among this daemon and the
// nodes the job names, and what those nodes call the job's datasets. Pure functions: the checks of
// the nodes themselves (CheckPeers, engine_peers.cc) ask the peers through peers.h.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "server/engine/types.h"

namespace trainerd::engine {

// The one rule that deals ranks and members: round this daemon and `nodes` in order, starting
// here. Index i (a rank, or a member's place in its sweep) lands here when i % (1 + nodes) is 0
// (returned as ""), else on nodes[i % (1 + nodes) - 1]. Rank 0 is therefore always here, where
// it reports, checkpoints and exports.
std::string NodeOf(const std::vector<std::string>& nodes, int64_t index);

// What a job's nodes call one of its datasets: a dataset of the job's owner there (her own upload
// there, or the copy this daemon sends), so that a peer tells her only of her own datasets. Her
// own dataset keeps its name; another's (one shared with her, or an admin's pick of a tenant's)
// gets its name with the first 16 hex digits of its SHA-256, so that it never takes the place of
// a dataset of hers of that name. Qualified ("OWNER/NAME", "/NAME" for a caller without a name):
// the leader's admin credentials name it there.
std::string NodeDatasetName(const DatasetMeta& meta, const std::string& submitter);

}  // namespace trainerd::engine

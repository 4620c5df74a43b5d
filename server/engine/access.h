// Who may see, use and manage what: the one rule for tenants, shared by the engine (datasets a
// job trains on, deleting and sharing datasets) and the services (jobs, listings). A tenant is a
// caller name (CallContext::owner). An admin sees and manages everything; another caller sees
// and manages what it created, and may also see and train on the datasets other tenants shared.
// A caller without a name (a token revoked mid-call) owns nothing, not even what was made before
// authentication was turned on. Refusals never tell a caller that something it may not see
// exists: it gets the NOT_FOUND an unknown name gets.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "server/engine/engine.h"
#include "server/engine/types.h"

namespace trainerd::engine {

// Whether `caller` may see and manage something `owner` created.
inline bool Owns(const CallContext& caller, const std::string& owner) {
  return caller.admin || (!caller.owner.empty() && caller.owner == owner);
}

// Whether `caller` may see the dataset and train on it.
inline bool MayUse(const CallContext& caller, const DatasetMeta& meta) {
  return Owns(caller, meta.owner) || meta.shared;
}

// OK when `caller` may delete or share the dataset; NOT_FOUND (as for an unknown name) when it
// may not see it; PERMISSION_DENIED naming the owner when it is shared with the caller.
inline absl::Status CheckMayManage(const CallContext& caller, const DatasetMeta& meta) {
  if (Owns(caller, meta.owner)) return absl::OkStatus();
  if (!meta.shared) return absl::NotFoundError(absl::StrCat("dataset '", meta.name, "' not found"));
  return absl::PermissionDeniedError(absl::StrCat(
      "dataset '", meta.name, "' belongs to ",
      meta.owner.empty() ? "nobody (uploaded before authentication)" : meta.owner,
      ", who shared it for training; only its owner or an admin may change or delete it"));
}

}  // namespace trainerd::engine

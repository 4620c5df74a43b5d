// What the engine is told about a call: who made it (auth.h: CallerOf), whether that caller is an
// admin, and its deadline. Every service builds its engine::CallContext here, so that no handler
// forgets the tenant.
#pragma once

#include <grpcpp/server_context.h>

#include <chrono>

#include "absl/time/time.h"
#include "server/engine/engine.h"
#include "server/service/auth.h"

namespace trainerd::service {

// The call's deadline; InfiniteFuture when the client set none.
inline absl::Time CallDeadline(const grpc::CallbackServerContext& context) {
  const std::chrono::system_clock::time_point deadline = context.deadline();
  if (deadline >= std::chrono::system_clock::time_point::max() - std::chrono::hours(24 * 365)) {
    return absl::InfiniteFuture();
  }
  return absl::FromChrono(deadline);
}

inline engine::CallContext CallContextOf(grpc::CallbackServerContext* context,
                                         Authenticator* authenticator) {
  const Caller caller = CallerOf(context, authenticator);
  engine::CallContext out;
  out.owner = caller.name;
  out.admin = caller.admin;
  out.deadline = CallDeadline(*context);
  return out;
}

}  // namespace trainerd::service

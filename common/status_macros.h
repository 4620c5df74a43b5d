// Status propagation macros. Debian 12's Abseil (20220623) has no RETURN_IF_ERROR, so trainerd
// defines its own once, here.
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define TRAINERD_STATUS_CONCAT_INNER_(a, b) a##b
#define TRAINERD_STATUS_CONCAT_(a, b) TRAINERD_STATUS_CONCAT_INNER_(a, b)

// Returns `expr`'s status from the enclosing function when it is not OK.
#define TRAINERD_RETURN_IF_ERROR(expr)                   \
  do {                                                   \
    ::absl::Status _trainerd_status = (expr);            \
    if (!_trainerd_status.ok()) return _trainerd_status; \
  } while (false)

// `TRAINERD_ASSIGN_OR_RETURN(auto x, FunctionReturningStatusOr());` declares/assigns `x` from
// the value, or returns the error from the enclosing function.
#define TRAINERD_ASSIGN_OR_RETURN(lhs, expr) \
  TRAINERD_ASSIGN_OR_RETURN_IMPL_(TRAINERD_STATUS_CONCAT_(_trainerd_statusor_, __LINE__), lhs, expr)

#define TRAINERD_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                                    \
  if (!statusor.ok()) return std::move(statusor).status();   \
  lhs = std::move(statusor).value()

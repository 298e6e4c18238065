// RETURN_IF_ERROR / ASSIGN_OR_RETURN: Abseil 20220623 ships neither, so they live here, once.
#ifndef TRAINSTEP_COMMON_STATUS_MACROS_H_
#define TRAINSTEP_COMMON_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define TRAINSTEP_CONCAT_INNER_(a, b) a##b
#define TRAINSTEP_CONCAT_(a, b) TRAINSTEP_CONCAT_INNER_(a, b)

#define RETURN_IF_ERROR(expr)                              \
  do {                                                     \
    ::absl::Status _trainstep_status = (expr);             \
    if (!_trainstep_status.ok()) return _trainstep_status; \
  } while (0)

#define ASSIGN_OR_RETURN(lhs, expr) \
  ASSIGN_OR_RETURN_IMPL_(TRAINSTEP_CONCAT_(_trainstep_statusor_, __LINE__), lhs, expr)

#define ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                           \
  if (!statusor.ok()) return statusor.status();     \
  lhs = std::move(statusor).value()

#endif  // TRAINSTEP_COMMON_STATUS_MACROS_H_

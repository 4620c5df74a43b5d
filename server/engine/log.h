// Minimal logging to stderr for the daemon (Debian 12's Abseil predates absl/log).
#pragma once

#include <exception>
#include <string>
#include <string_view>

namespace trainerd::engine {

enum class LogLevel { kInfo, kWarning, kError };

// Writes "I1129 19:20:01.123 trainerd] message" to stderr as one write. Thread-safe.
void Log(LogLevel level, std::string_view message);

inline void LogInfo(std::string_view message) { Log(LogLevel::kInfo, message); }
inline void LogWarning(std::string_view message) { Log(LogLevel::kWarning, message); }
inline void LogError(std::string_view message) { Log(LogLevel::kError, message); }

// The first line of an exception's message, for a status: LibTorch's c10::Error carries a C++
// stack trace after it, which no sentence for a user should. An error of the TorchScript
// interpreter keeps the line that names its cause too ("The following operation failed in the
// TorchScript interpreter: RuntimeError: ... not enough memory ...").
std::string FirstLineOf(const std::exception& e);

}  // namespace trainerd::engine

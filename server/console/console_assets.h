// The console's page, script and style, compiled into trainerd from server/console/assets/
// (embed_assets.cmake writes console_assets.cc at build time).
#pragma once

#include <cstddef>

#include "absl/strings/string_view.h"

namespace trainerd::console {

struct ConsoleAsset {
  const char* path;          // "/index.html", "/console.js", "/console.css"
  const char* content_type;  // with its charset
  const char* data;
  size_t size;
};

// The asset served at `path`, or nullptr.
const ConsoleAsset* FindConsoleAsset(absl::string_view path);

}  // namespace trainerd::console

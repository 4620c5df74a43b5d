// Reads a whole file into memory, with the error wording the CSV and NPY readers share.
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace trainerd {

// The file's bytes. NOT_FOUND "cannot open 'path': <reason>" when it cannot be opened (missing,
// unreadable, a directory); other errors start with "path: ".
absl::StatusOr<std::string> ReadFileToString(const std::string& path);

}  // namespace trainerd

// The project's version (CMake's PROJECT_VERSION), shared by trainerd and trainctl so that
// `trainctl version` and `trainerd --version` say the same thing of one build.
#pragma once

namespace trainerd {

// "0.1.0".
const char* TrainerdVersion();

}  // namespace trainerd

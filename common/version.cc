// Only this file sees TRAINERD_VERSION (common/CMakeLists.txt), so that a new version rebuilds
// one object.
#include "common/version.h"

namespace trainerd {

const char* TrainerdVersion() { return TRAINERD_VERSION; }

}  // namespace trainerd

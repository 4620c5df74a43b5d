// Reaping a checker or worker whose exit nobody needs to wait for.
#pragma once

#include <sys/types.h>

namespace trainerd::engine {

// Reaps `pid` (a child of this process) on a thread of its own: for a checker or worker that has
// said all it had to say and closed its streams, so that a submission or a job does not wait for
// its exit (the kernel unmapping LibTorch, some 20 ms) and no zombie is left. Returns at once.
void ReapWhenItExits(pid_t pid);

}  // namespace trainerd::engine

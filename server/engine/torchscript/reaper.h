// Reaping a checker or worker whose exit nobody needs to wait for.
#pragma once

#include <sys/types.h>

namespace trainerd::engine {

// Ends `pid` (a child of this process) and reaps it on a thread of its own: for a checker or
// worker that has said all it had to say and closed its streams, so that a submission or a job
// does not wait for its exit (the kernel unmapping LibTorch, some 20 ms) and no zombie is left.
// It is killed (SIGKILL) first: one that closed its streams but lingered would otherwise hold the
// reaping thread for as long as it liked. Returns at once.
void EndAndReap(pid_t pid);

}  // namespace trainerd::engine

// A data-parallel job in this process (issue 21): its ranks as threads, each on the CPU, meeting
// at a store this process hosts and training with RunRank (training/trainer.h) through a Gloo
// group. Engine-internal so far: the API has no replicas field yet, and the job manager does not
// call it; the tests do.
#pragma once

#include "absl/time/time.h"
#include "server/engine/training/trainer.h"

namespace trainerd::engine {

// Runs `run` as run.spec.replicas ranks (threads of this process, rank 0 on the calling thread)
// and returns the job's outcome: rank 0's, or the failure of the rank that failed first for its
// own reason (named "rank R: ...") when the others only lost it. `timeout` bounds the ranks'
// meeting and every collective: a rank that fails or hangs ends the others within it. Never
// throws.
TrainingOutcome RunDataParallel(const TrainingRun& run, absl::Duration timeout = absl::Seconds(60));

}  // namespace trainerd::engine

// Cells that more than one of trainctl's views shows (internal to client/; the views are in
// dataset_views.cc, job_views.cc, sweep_views.cc and device_views.cc): a job's device, epochs and
// loss, a sweep member's swept values, and the two small helpers they all use.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "google/protobuf/repeated_field.h"
#include "trainerd/v1/jobs.pb.h"

namespace trainerd::client {

// The values as a vector (for ShapeToString).
std::vector<int64_t> ToVector(const google::protobuf::RepeatedField<int64_t>& values);

// `text`, or "-" when it is empty.
std::string OrDash(const std::string& text);

// The device the job runs or ran on (else the one its spec asked for), and when device auto
// chose it the estimates it chose from.
std::string JobDevice(const v1::Job& job);

// Epochs finished: a listing's basic view carries the count without the epochs themselves.
int32_t EpochsCompleted(const v1::Job& job);

// "3/20": epochs finished out of those planned.
std::string EpochProgress(const v1::Job& job);

// The final loss (FormatLoss), "-" before the first epoch.
std::string JobLoss(const v1::Job& job);

// A sweep member's swept values as table cells: "-" for a momentum its optimizer ignores and for
// an unset weight decay or seed.
std::string SweptLearningRate(const v1::Job& job);
std::string SweptMomentum(const v1::Job& job);
std::string SweptWeightDecay(const v1::Job& job);
std::string SweptSeed(const v1::Job& job);

}  // namespace trainerd::client

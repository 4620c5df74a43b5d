// The one hand-written helper beside the generated code: the field paths in which two messages of
// one type differ, as a google.protobuf.FieldMask names them. trainctl's sweep points and the
// daemon's spread sweeps both send a member's spec with the paths in which it differs from its
// sweep's (SweepPoint.fields).
#pragma once

#include <string>
#include <vector>

#include "google/protobuf/message.h"

namespace trainerd::proto {

// The paths of the leaf fields in which `a` differs from `b` (the same type): a singular message
// field by its own fields, any other field (a repeated one as a whole) by its name, in field
// order. The paths in `skip` are left out (and not descended into).
std::vector<std::string> DifferingPaths(const google::protobuf::Message& a,
                                        const google::protobuf::Message& b,
                                        const std::vector<std::string>& skip = {});

// The four a SweepPoint carries of its own (seed, learning rate, momentum, weight decay), as
// JobSpec paths: a member's spec differs from its sweep's in them without fields of its own.
const std::vector<std::string>& SweptPaths();

}  // namespace trainerd::proto

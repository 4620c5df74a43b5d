// `trainctl sweep`'s request: the lists' product (SweepRequestFromFlags), the halving flags, and
// the parsing of a list flag's values. The points and search files are sweep_points.cc's.
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "client/requests.h"
#include "common/job_limits.h"
#include "common/status_macros.h"

namespace trainerd::client {
namespace {

// The elements of a sweep's list flag, each stripped of spaces; INVALID_ARGUMENT for an empty one
// or more than kMaxSweepValues.
absl::StatusOr<std::vector<std::string>> SplitSweepList(absl::string_view flag,
                                                        absl::string_view text) {
  std::vector<std::string> elements;
  for (absl::string_view element : absl::StrSplit(text, ',')) {
    element = absl::StripAsciiWhitespace(element);
    if (element.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag, ": value ", elements.size() + 1, " of '", text,
                       "' is empty (give comma-separated values, e.g. 0.1,0.01)"));
    }
    elements.emplace_back(element);
  }
  if (elements.size() > static_cast<size_t>(kMaxSweepValues)) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, " has ", elements.size(),
                                                   " values; a sweep takes at most ",
                                                   kMaxSweepValues, " per list"));
  }
  return elements;
}

absl::StatusOr<std::vector<double>> SweepValues(absl::string_view flag,
                                                const std::vector<std::string>& elements) {
  std::vector<double> values;
  for (const std::string& element : elements) {
    double value = 0;
    if (!absl::SimpleAtod(element, &value) || !std::isfinite(value)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag, ": '", element, "' is not a number"));
    }
    values.push_back(value);
  }
  return values;
}

absl::StatusOr<std::vector<uint64_t>> SweepSeeds(const std::vector<std::string>& elements) {
  std::vector<uint64_t> seeds;
  for (const std::string& element : elements) {
    uint64_t seed = 0;
    // SimpleAtoi would take "-1" as 2^64 - 1.
    if (absl::StartsWith(element, "-") || !absl::SimpleAtoi(element, &seed)) {
      return absl::InvalidArgumentError(absl::StrCat("--seed: '", element,
                                                     "' is not a whole number between 0 and ",
                                                     std::numeric_limits<uint64_t>::max()));
    }
    seeds.push_back(seed);
  }
  return seeds;
}

}  // namespace

absl::StatusOr<std::vector<double>> ParseSweepValues(absl::string_view flag,
                                                     absl::string_view text) {
  TRAINERD_ASSIGN_OR_RETURN(std::vector<std::string> elements, SplitSweepList(flag, text));
  return SweepValues(flag, elements);
}

absl::StatusOr<std::vector<uint64_t>> ParseSweepSeeds(absl::string_view text) {
  TRAINERD_ASSIGN_OR_RETURN(std::vector<std::string> elements, SplitSweepList("seed", text));
  return SweepSeeds(elements);
}

namespace {

absl::StatusOr<v1::SubmitSweepRequest> SweepListsRequestFromFlags(const Invocation& invocation);

}  // namespace

absl::StatusOr<v1::SubmitSweepRequest> SweepRequestFromFlags(const Invocation& invocation) {
  if (invocation.Has("torchscript")) {
    return absl::InvalidArgumentError(
        "--torchscript is for 'trainctl submit' only: the members of a sweep train a --model spec");
  }
  if (!invocation.Has("search") && (invocation.Has("trials") || invocation.Has("search-seed"))) {
    return absl::InvalidArgumentError("--trials and --search-seed draw a --search FILE's members");
  }
  TRAINERD_ASSIGN_OR_RETURN(v1::SubmitSweepRequest request,
                            invocation.Has("search")   ? SweepSearchRequestFromFlags(invocation)
                            : invocation.Has("points") ? SweepPointsRequestFromFlags(invocation)
                                                       : SweepListsRequestFromFlags(invocation));
  if (invocation.Has("halving-reduction-factor") && !invocation.Has("halving-min-epochs")) {
    return absl::InvalidArgumentError(
        "--halving-reduction-factor applies to halving; give --halving-min-epochs N too");
  }
  if (invocation.Has("halving-min-epochs")) {
    // The daemon checks the rungs against each member's epochs.
    TRAINERD_ASSIGN_OR_RETURN(int64_t min_epochs,
                              invocation.GetInt("halving-min-epochs", 1, 1, kMaxEpochs));
    TRAINERD_ASSIGN_OR_RETURN(int64_t factor,
                              invocation.GetInt("halving-reduction-factor", 3, 2, 100));
    v1::Halving* halving = request.mutable_spec()->mutable_halving();
    halving->set_min_epochs(static_cast<int32_t>(min_epochs));
    halving->set_reduction_factor(static_cast<int32_t>(factor));
  }
  return request;
}

namespace {

absl::StatusOr<v1::SubmitSweepRequest> SweepListsRequestFromFlags(const Invocation& invocation) {
  // The lists, with their elements as written: they are handed to JobSpecFromFlags as the flag's
  // value, so that every value meets submit's own checks and messages.
  struct SweptFlag {
    absl::string_view flag;
    absl::string_view plural;  // for the product's message
    std::vector<std::string> elements;
  };
  std::vector<SweptFlag> swept;
  for (const auto& [flag, plural] : std::vector<std::pair<absl::string_view, absl::string_view>>{
           {"lr", "learning rates"},
           {"momentum", "momenta"},
           {"weight-decay", "weight decays"},
           {"seed", "seeds"}}) {
    if (!invocation.Has(flag)) continue;
    TRAINERD_ASSIGN_OR_RETURN(std::vector<std::string> elements,
                              SplitSweepList(flag, invocation.Get(flag)));
    swept.push_back({flag, plural, std::move(elements)});
  }

  v1::SubmitSweepRequest request;
  for (const SweptFlag& list : swept) {
    if (list.flag == "seed") {
      TRAINERD_ASSIGN_OR_RETURN(std::vector<uint64_t> seeds, SweepSeeds(list.elements));
      request.mutable_seeds()->Add(seeds.begin(), seeds.end());
      continue;
    }
    TRAINERD_ASSIGN_OR_RETURN(std::vector<double> values, SweepValues(list.flag, list.elements));
    google::protobuf::RepeatedField<double>* field =
        list.flag == "lr"         ? request.mutable_learning_rates()
        : list.flag == "momentum" ? request.mutable_momenta()
                                  : request.mutable_weight_decays();
    field->Add(values.begin(), values.end());
  }
  // Each list is at most kMaxSweepValues long, so the product of four fits in 64 bits.
  uint64_t members = 1;
  std::vector<std::string> factors;
  for (const SweptFlag& list : swept) {
    members *= list.elements.size();
    if (list.elements.size() > 1) {
      factors.push_back(absl::StrCat(list.elements.size(), " ", list.plural));
    }
  }
  if (members > static_cast<uint64_t>(kMaxSweepMembers)) {
    return absl::InvalidArgumentError(absl::StrCat("a sweep has at most ", kMaxSweepMembers,
                                                   " members; ", absl::StrJoin(factors, " x "),
                                                   " make ", members));
  }

  // The spec: every list at its first value. Then each further value in place of the first, the
  // other lists at theirs: the checks that tie two flags together (--nesterov and the momentum,
  // --min-lr and the rate) involve one swept flag each, so this covers every member.
  Invocation first = invocation;
  for (const SweptFlag& list : swept) first.flags[std::string(list.flag)] = list.elements[0];
  TRAINERD_ASSIGN_OR_RETURN(*request.mutable_spec(), JobSpecFromFlags(first));
  for (const SweptFlag& list : swept) {
    for (size_t i = 1; i < list.elements.size(); ++i) {
      Invocation other = first;
      other.flags[std::string(list.flag)] = list.elements[i];
      TRAINERD_RETURN_IF_ERROR(JobSpecFromFlags(other).status());
    }
  }
  return request;
}

}  // namespace

}  // namespace trainerd::client

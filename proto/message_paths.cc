#include "proto/message_paths.h"

#include <algorithm>
#include <memory>

#include "google/protobuf/descriptor.h"
#include "google/protobuf/field_mask.pb.h"
#include "google/protobuf/util/field_mask_util.h"
#include "google/protobuf/util/message_differencer.h"

namespace trainerd::proto {
namespace {

void AppendDifferingPaths(const google::protobuf::Message& a, const google::protobuf::Message& b,
                          const std::string& prefix, const std::vector<std::string>& skip,
                          std::vector<std::string>* paths) {
  using google::protobuf::FieldDescriptor;
  using google::protobuf::util::FieldMaskUtil;
  const google::protobuf::Descriptor* type = a.GetDescriptor();
  const google::protobuf::Reflection* reflection = a.GetReflection();
  for (int i = 0; i < type->field_count(); ++i) {
    const FieldDescriptor* field = type->field(i);
    const std::string path = prefix + field->name();
    if (std::find(skip.begin(), skip.end(), path) != skip.end()) continue;
    if (field->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE && !field->is_repeated()) {
      AppendDifferingPaths(reflection->GetMessage(a, field), reflection->GetMessage(b, field),
                           path + ".", skip, paths);
      continue;
    }
    // The field alone of each, compared as messages (a repeated field element by element).
    std::unique_ptr<google::protobuf::Message> only_a(a.New());
    std::unique_ptr<google::protobuf::Message> only_b(b.New());
    google::protobuf::FieldMask mask;
    mask.add_paths(field->name());
    FieldMaskUtil::MergeMessageTo(a, mask, FieldMaskUtil::MergeOptions(), only_a.get());
    FieldMaskUtil::MergeMessageTo(b, mask, FieldMaskUtil::MergeOptions(), only_b.get());
    if (!google::protobuf::util::MessageDifferencer::Equals(*only_a, *only_b)) {
      paths->push_back(path);
    }
  }
}

}  // namespace

std::vector<std::string> DifferingPaths(const google::protobuf::Message& a,
                                        const google::protobuf::Message& b,
                                        const std::vector<std::string>& skip) {
  std::vector<std::string> paths;
  AppendDifferingPaths(a, b, "", skip, &paths);
  return paths;
}

const std::vector<std::string>& SweptPaths() {
  static const auto* const paths = new std::vector<std::string>{
      "seed", "optimizer.learning_rate", "optimizer.momentum", "optimizer.weight_decay"};
  return *paths;
}

}  // namespace trainerd::proto

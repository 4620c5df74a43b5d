// trainctl's views of datasets (client/output.h): the table of `dataset list` and the key-value
// view of `dataset get` (and of an upload's result).
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/output.h"
#include "client/view_cells.h"
#include "common/table.h"
#include "google/protobuf/repeated_field.h"
#include "trainerd/v1/datasets.pb.h"

namespace trainerd::client {
namespace {

// "4 float32", "scalar int64".
std::string TensorDescription(const google::protobuf::RepeatedField<int64_t>& shape,
                              v1::DType dtype) {
  return absl::StrCat(ShapeToString(ToVector(shape)), " ", DTypeName(dtype));
}

// The device, and "(on disk)" when the dataset is not resident now (it loads when used).
std::string DatasetWhere(const v1::Dataset& dataset) {
  std::string where = OrDash(dataset.device());
  if (dataset.location() == v1::DATASET_LOCATION_DISK) absl::StrAppend(&where, " (on disk)");
  if (dataset.location() == v1::DATASET_LOCATION_HOST) absl::StrAppend(&where, " (in host memory)");
  return where;
}

}  // namespace

std::string DatasetListTable(const v1::ListDatasetsResponse& response, TableOptions options) {
  std::vector<std::string> headers = {"NAME", "ROWS",   "FEATURES", "TARGETS",
                                      "SIZE", "DEVICE", "CREATED"};
  if (options.wide) headers.insert(headers.end(), {"LAST USED", "OWNER", "SHA256"});
  TextTable table(std::move(headers));
  for (const v1::Dataset& dataset : response.datasets()) {
    std::vector<std::string> row = {
        dataset.name(),
        absl::StrCat(dataset.row_count()),
        ShapeToString(ToVector(dataset.feature_shape())),
        TensorDescription(dataset.target_shape(), dataset.target_dtype()),
        FormatBytes(dataset.size_bytes()),
        DatasetWhere(dataset),
        FormatTimestamp(dataset.create_time())};
    if (options.wide) {
      row.insert(row.end(), {dataset.has_last_use_time() ? FormatTimestamp(dataset.last_use_time())
                                                         : std::string("-"),
                             OrDash(dataset.owner()), OrDash(dataset.sha256())});
    }
    table.AddRow(std::move(row));
  }
  return table.Render(options.headers);
}

std::string DatasetUploadedLine(const v1::Dataset& dataset) {
  std::string targets = TensorDescription(dataset.target_shape(), dataset.target_dtype());
  if (dataset.target_dtype() == v1::DTYPE_INT64) {
    absl::StrAppend(&targets, " classes ", dataset.target_min(), "..", dataset.target_max());
  }
  return absl::StrCat("uploaded dataset '", dataset.name(), "': ", dataset.row_count(),
                      dataset.row_count() == 1 ? " row" : " rows", ", features ",
                      ShapeToString(ToVector(dataset.feature_shape())), ", targets ", targets, ", ",
                      FormatBytes(dataset.size_bytes()), " on ", DatasetWhere(dataset), "\n");
}

std::string DatasetDetails(const v1::Dataset& dataset) {
  std::string targets = TensorDescription(dataset.target_shape(), dataset.target_dtype());
  if (dataset.target_dtype() == v1::DTYPE_INT64) {
    absl::StrAppend(&targets, " (classes ", dataset.target_min(), "..", dataset.target_max(), ")");
  }
  std::vector<std::pair<std::string, std::string>> lines = {
      {"name", dataset.name()},
      {"rows", absl::StrCat(dataset.row_count())},
      {"features", absl::StrCat(ShapeToString(ToVector(dataset.feature_shape())), " float32")},
      {"targets", targets},
      {"size", dataset.size_bytes() < 1024 ? FormatBytes(dataset.size_bytes())
                                           : absl::StrCat(FormatBytes(dataset.size_bytes()), " (",
                                                          dataset.size_bytes(), " bytes)")},
      {"sha256", OrDash(dataset.sha256())},
      {"device", DatasetWhere(dataset)},
      {"created", FormatTimestamp(dataset.create_time())},
  };
  if (dataset.has_last_use_time()) {
    lines.push_back({"last use", FormatTimestamp(dataset.last_use_time())});
  }
  // Only a daemon with authentication records who uploaded it.
  if (!dataset.owner().empty()) lines.push_back({"owner", dataset.owner()});
  if (dataset.shared()) lines.push_back({"shared", "yes: other tenants' jobs may train on it"});
  if (dataset.peer_copy()) {
    lines.push_back({"peer copy",
                     "yes: another daemon sent it for its jobs here; deleted once unused for "
                     "--peer_copy_retention"});
  }
  return KeyValueLines(lines);
}

}  // namespace trainerd::client

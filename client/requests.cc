// Local checks and request building for `dataset upload` and `submit`.
#include "client/requests.h"

#include <cstdint>
#include <limits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/csv_reader.h"
#include "common/model_spec.h"
#include "common/npy_reader.h"
#include "common/status_macros.h"

namespace trainerd::client {
namespace {

// A guard against typos such as --target-columns 10000000; no real table has more.
constexpr int64_t kMaxTargetColumns = 1 << 20;

constexpr double kDefaultLearningRate = 0.01;
constexpr int64_t kDefaultBatchSize = 32;
constexpr int64_t kDefaultEpochs = 10;

absl::StatusOr<TargetDType> ParseTargetDType(const std::string& text) {
  if (text == "float32") return TargetDType::kFloat32;
  if (text == "int64") return TargetDType::kInt64;
  return absl::InvalidArgumentError(
      absl::StrCat("--target-dtype: unknown dtype '", text, "' (expected float32 or int64)"));
}

absl::StatusOr<v1::Loss> ParseLoss(const std::string& text) {
  if (text == "mse") return v1::LOSS_MSE;
  if (text == "cross_entropy" || text == "cross-entropy") return v1::LOSS_CROSS_ENTROPY;
  return absl::InvalidArgumentError(
      absl::StrCat("--loss: unknown loss '", text, "' (expected mse or cross_entropy)"));
}

absl::StatusOr<v1::OptimizerKind> ParseOptimizer(const std::string& text) {
  if (text == "sgd") return v1::OPTIMIZER_KIND_SGD;
  if (text == "adam") return v1::OPTIMIZER_KIND_ADAM;
  return absl::InvalidArgumentError(
      absl::StrCat("--optimizer: unknown optimizer '", text, "' (expected sgd or adam)"));
}

v1::DType ToProto(TargetDType dtype) {
  return dtype == TargetDType::kInt64 ? v1::DTYPE_INT64 : v1::DTYPE_FLOAT32;
}

}  // namespace

absl::StatusOr<UploadInput> UploadInputFromFlags(const Invocation& invocation) {
  UploadInput input;
  input.features_path = invocation.args.at(1);
  input.npy = absl::EndsWithIgnoreCase(input.features_path, ".npy");
  TRAINERD_ASSIGN_OR_RETURN(int64_t columns,
                            invocation.GetInt("target-columns", 1, 1, kMaxTargetColumns));
  input.target_columns = static_cast<int>(columns);
  TRAINERD_ASSIGN_OR_RETURN(input.target_dtype,
                            ParseTargetDType(invocation.Get("target-dtype", "float32")));
  if (invocation.Has("targets")) {
    if (!input.npy) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--targets needs the features as a .npy file too; '", input.features_path, "' is not"));
    }
    if (invocation.Has("target-columns")) {
      return absl::InvalidArgumentError(
          "--target-columns does not apply with --targets (every column of FILE is a feature)");
    }
    input.targets_path = invocation.Get("targets");
  }
  if (input.target_dtype == TargetDType::kInt64 && input.target_columns != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--target-dtype int64 takes one target column (a class index), got --target-columns ",
        input.target_columns));
  }
  return input;
}

absl::StatusOr<Table> ReadUploadInput(const UploadInput& input) {
  absl::StatusOr<Table> table;
  if (input.npy) {
    TRAINERD_ASSIGN_OR_RETURN(NpyArray features, ReadNpyFile(input.features_path));
    std::optional<NpyArray> targets;
    if (input.targets_path.has_value()) {
      TRAINERD_ASSIGN_OR_RETURN(targets, ReadNpyFile(*input.targets_path));
    }
    NpyTableOptions options;
    options.target_columns = input.target_columns;
    options.target_dtype = input.target_dtype;
    table = TableFromNpy(features, targets, options);
    if (!table.ok()) {
      // TableFromNpy does not know the file names; say which files it was about.
      std::string files = input.features_path;
      if (input.targets_path.has_value()) absl::StrAppend(&files, " and ", *input.targets_path);
      return absl::Status(table.status().code(),
                          absl::StrCat(files, ": ", table.status().message()));
    }
  } else {
    CsvOptions options;
    options.target_columns = input.target_columns;
    options.target_dtype = input.target_dtype;
    table = ReadCsvFile(input.features_path, options);
    if (!table.ok()) return table.status();
  }
  TRAINERD_RETURN_IF_ERROR(ValidateTable(*table));
  return table;
}

v1::DatasetHeader MakeDatasetHeader(const std::string& name, const Table& table,
                                    const std::string& sha256_hex) {
  v1::DatasetHeader header;
  header.set_name(name);
  for (int64_t dim : table.feature_shape) header.add_feature_shape(dim);
  for (int64_t dim : table.target_shape) header.add_target_shape(dim);
  header.set_target_dtype(ToProto(table.target_dtype));
  header.set_row_count(table.rows);
  header.set_sha256(sha256_hex);
  return header;
}

absl::StatusOr<v1::JobSpec> JobSpecFromFlags(const Invocation& invocation) {
  v1::JobSpec spec;
  if (!invocation.Has("dataset")) {
    return absl::InvalidArgumentError("submit needs --dataset NAME (see 'trainctl submit --help')");
  }
  if (!invocation.Has("model")) {
    return absl::InvalidArgumentError(
        "submit needs --model SPEC, e.g. --model linear:64,relu,linear:1");
  }
  spec.set_dataset(invocation.Get("dataset"));
  TRAINERD_RETURN_IF_ERROR(ValidateDatasetName(spec.dataset()));

  absl::StatusOr<ModelSpec> model = ParseModelSpec(invocation.Get("model"));
  if (!model.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--model: ", model.status().message()));
  }
  spec.set_model(model->ToString());

  TRAINERD_ASSIGN_OR_RETURN(v1::Loss loss, ParseLoss(invocation.Get("loss", "mse")));
  spec.set_loss(loss);

  v1::Optimizer* optimizer = spec.mutable_optimizer();
  TRAINERD_ASSIGN_OR_RETURN(v1::OptimizerKind kind,
                            ParseOptimizer(invocation.Get("optimizer", "sgd")));
  optimizer->set_kind(kind);
  TRAINERD_ASSIGN_OR_RETURN(double lr, invocation.GetDouble("lr", kDefaultLearningRate));
  if (lr <= 0) return absl::InvalidArgumentError(absl::StrFormat("--lr must be > 0, got %g", lr));
  optimizer->set_learning_rate(lr);
  TRAINERD_ASSIGN_OR_RETURN(double momentum, invocation.GetDouble("momentum", 0));
  if (invocation.Has("momentum") && kind != v1::OPTIMIZER_KIND_SGD) {
    return absl::InvalidArgumentError("--momentum applies to --optimizer sgd only");
  }
  if (momentum < 0 || momentum >= 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--momentum must be in [0, 1), got %g", momentum));
  }
  optimizer->set_momentum(momentum);

  TRAINERD_ASSIGN_OR_RETURN(
      int64_t batch_size,
      invocation.GetInt("batch-size", kDefaultBatchSize, 1, std::numeric_limits<int64_t>::max()));
  spec.set_batch_size(batch_size);
  TRAINERD_ASSIGN_OR_RETURN(int64_t epochs, invocation.GetInt("epochs", kDefaultEpochs, 1,
                                                              std::numeric_limits<int32_t>::max()));
  spec.set_epochs(static_cast<int32_t>(epochs));

  spec.set_shuffle(!invocation.Has("no-shuffle"));
  if (invocation.Has("seed")) {
    TRAINERD_ASSIGN_OR_RETURN(uint64_t seed, invocation.GetUint("seed", 0));
    spec.set_seed(seed);
  }
  if (invocation.Has("device")) {
    if (invocation.Get("device").empty()) {
      return absl::InvalidArgumentError("--device needs a device, e.g. cpu, cuda or cuda:0");
    }
    spec.set_device(invocation.Get("device"));
  }
  return spec;
}

}  // namespace trainerd::client

// DownloadModel's and DownloadCheckpoint's stream: a job's file in chunks, checked against the
// digest recorded with the job (job_streams.h).
#include <algorithm>
#include <cerrno>
#include <fstream>
#include <memory>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/file_io.h"
#include "common/sha256.h"
#include "server/engine/log.h"
#include "server/service/grpc_status.h"
#include "server/service/job_streams.h"

namespace trainerd::service {
namespace {

// Streams a file the daemon wrote for a job: a succeeded job's TorchScript archive from
// <data_dir>/models/<id>.pt or its state_dict from <id>.safetensors (DownloadModel), or one of its
// checkpoints (DownloadCheckpoint), in
// chunks of at most kModelChunkBytes. One write in flight: the next chunk is read in OnWriteDone,
// so at most one chunk is in memory whatever the file's size. That read is a small local file read
// (1 MiB from a file the engine wrote and fsynced, normally still in the page cache), which the
// service accepts on a reaction instead of adding a hop to the engine's I/O thread per chunk.
// Finish is called once (after the last chunk, on an error, or when the client goes away — a
// write is in flight until then, so a cancelled client always surfaces as OnWriteDone(false));
// the reactor deletes itself in OnDone.
class ModelDownloadReactor final : public grpc::ServerWriteReactor<v1::ModelChunk> {
 public:
  static constexpr int64_t kModelChunkBytes = int64_t{1} << 20;

  // Called once, from DownloadModel, before any reaction can run: the TorchScript archive, or
  // with MODEL_FORMAT_SAFETENSORS the state_dict kept beside it (<id>.safetensors).
  void Start(engine::Engine* engine, const std::string& id, v1::ModelFormat format,
             const absl::Status& access) {
    if (!access.ok()) {
      Finish(ToGrpcStatus(access));
      return;
    }
    if (format == v1::MODEL_FORMAT_SAFETENSORS) {
      const absl::StatusOr<engine::Engine::StateDictFile> file = engine->StateDictPath(id);
      if (!file.ok()) {
        Finish(ToGrpcStatus(file.status()));
        return;
      }
      Open(id, file->path, file->sha256, "state_dict", "", "train the job again");
      return;
    }
    if (format != v1::MODEL_FORMAT_UNSPECIFIED && format != v1::MODEL_FORMAT_TORCHSCRIPT &&
        format != v1::MODEL_FORMAT_PT2) {
      Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          absl::StrCat("format must be MODEL_FORMAT_TORCHSCRIPT (1), "
                                       "MODEL_FORMAT_SAFETENSORS (2) or MODEL_FORMAT_PT2 (3); got ",
                                       static_cast<int>(format))));
      return;
    }
    const absl::StatusOr<std::string> path = engine->ModelArchivePath(id);
    if (!path.ok()) {
      Finish(ToGrpcStatus(path.status()));
      return;
    }
    std::string expected_sha256;
    if (absl::StatusOr<engine::JobSnapshot> job = engine->GetJob(id); job.ok()) {
      expected_sha256 = job->model_sha256;  // empty for models of older builds: not checked
      // An exported program's job keeps its model as a .pt2; its spec names it
      // "exported (N bytes)" (engine_admission.cc). A spec-built job's .pt2 is made from its
      // state_dict; a TorchScript job's needs the user's Python module.
      if (format == v1::MODEL_FORMAT_PT2 && !absl::StartsWith(job->spec.model, "exported (")) {
        if (absl::StartsWith(job->spec.model, "torchscript (")) {
          Finish(grpc::Status(
              grpc::StatusCode::FAILED_PRECONDITION,
              absl::StrCat("job '", id,
                           "' trained a TorchScript module, whose .pt2 is made where its Python "
                           "class is: job.module(MyNet()) then torch.export.export, or the "
                           "Python client's job.export(path, module=MyNet()); the weights come "
                           "as safetensors (--format safetensors)")));
          return;
        }
        const absl::StatusOr<engine::Engine::StateDictFile> pt2 = engine->Pt2Path(id);
        if (!pt2.ok()) {
          Finish(ToGrpcStatus(pt2.status()));
          return;
        }
        Open(id, pt2->path, pt2->sha256, ".pt2", "", "train the job again");
        return;
      }
    }
    Open(id, *path, expected_sha256, "model", "", "train the job again");
  }

  // Called once, from DownloadCheckpoint: `epoch`'s checkpoint, or the newest with 0.
  void StartCheckpoint(engine::Engine* engine, const std::string& id, int32_t epoch,
                       const absl::Status& access) {
    if (!access.ok()) {
      Finish(ToGrpcStatus(access));
      return;
    }
    if (epoch < 0) {
      Finish(grpc::Status(
          grpc::StatusCode::INVALID_ARGUMENT,
          absl::StrCat("checkpoint epoch must be >= 1, or 0 for the newest; got ", epoch)));
      return;
    }
    engine::CheckpointInfo info;
    const absl::StatusOr<std::string> path = engine->CheckpointFilePath(id, epoch, &info);
    if (!path.ok()) {
      Finish(ToGrpcStatus(path.status()));
      return;
    }
    // The SHA-256 recorded when it was written (empty for checkpoints of older builds: not
    // checked).
    Open(id, *path, info.sha256, "checkpoint", absl::StrCat(" (epoch ", info.epoch, ")"),
         "download another epoch's checkpoint");
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {  // the client went away
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the client went away"));
      return;
    }
    if (remaining_ == 0) {
      // Every byte went through the hash: a file damaged on disk (a flipped byte, a cut) ends
      // the stream DATA_LOSS instead of OK, and trainctl keeps nothing.
      const std::string digest = hash_.HexDigest();
      if (!expected_sha256_.empty() && digest != expected_sha256_) {
        engine::LogWarning(
            absl::StrCat("the ", what_, " file '", path_, "' of job '", id_, "'", detail_,
                         " does not match the checksum recorded when it was "
                         "written (",
                         expected_sha256_, "; the file has ", digest, "): it is damaged"));
        Finish(grpc::Status(grpc::StatusCode::DATA_LOSS,
                            absl::StrCat("the ", what_, " file of job '", id_, "'", detail_,
                                         " is damaged (it no longer matches the checksum "
                                         "recorded when it was written); ",
                                         remedy_)));
        return;
      }
      Finish(grpc::Status::OK);
      return;
    }
    chunk_.set_total_bytes(0);  // only on the first chunk
    WriteNextChunk();
  }

  void OnDone() override { delete this; }

 private:
  void WriteNextChunk() {
    const int64_t n = std::min(remaining_, kModelChunkBytes);
    std::string* data = chunk_.mutable_data();
    data->resize(static_cast<size_t>(n));
    if (n > 0 && !file_.read(data->data(), n)) {
      Finish(grpc::Status(grpc::StatusCode::DATA_LOSS, "the " + what_ + " file ended early"));
      return;
    }
    hash_.Update(*data);
    remaining_ -= n;
    StartWrite(&chunk_);
  }

  void Open(const std::string& id, const std::string& path, const std::string& expected_sha256,
            std::string what, std::string detail, std::string remedy) {
    id_ = id;
    path_ = path;
    expected_sha256_ = expected_sha256;
    what_ = std::move(what);
    detail_ = std::move(detail);
    remedy_ = std::move(remedy);
    errno = 0;
    file_.open(path, std::ios::binary | std::ios::ate);
    if (!file_) {
      // Only a file that is there and cannot be read is lost data: a job deleted since the
      // lookup is NOT_FOUND, and a daemon out of descriptors is RESOURCE_EXHAUSTED (try again).
      const int error_number = errno;
      if (error_number == ENOENT) {
        Finish(grpc::Status(grpc::StatusCode::NOT_FOUND,
                            "job '" + id + "' was deleted; its " + what_ + " is gone"));
      } else if (IsOutOfDescriptors(error_number)) {
        Finish(ToGrpcStatus(TooManyOpenFiles(error_number, "opening the " + what_ + " file")));
      } else {
        Finish(grpc::Status(grpc::StatusCode::DATA_LOSS, "the " + what_ + " file of job '" + id +
                                                             "'" + detail_ + " cannot be read"));
      }
      return;
    }
    remaining_ = static_cast<int64_t>(file_.tellg());
    file_.seekg(0);
    chunk_.set_total_bytes(remaining_);
    WriteNextChunk();  // the first chunk goes even for an empty file, carrying total_bytes
  }

  std::ifstream file_;
  std::string id_;
  std::string path_;
  std::string what_;             // "model" or "checkpoint": what the messages name
  std::string detail_;           // after the job in the messages: "" or " (epoch 3)"
  std::string remedy_;           // what to do about a damaged file
  std::string expected_sha256_;  // recorded with the job; empty: not checked
  Sha256 hash_;                  // of the bytes sent so far
  int64_t remaining_ = 0;        // bytes of the file not yet written
  v1::ModelChunk chunk_;         // the write in flight
};

}  // namespace

grpc::ServerWriteReactor<v1::ModelChunk>* StartModelDownload(engine::Engine* engine,
                                                             const std::string& id,
                                                             v1::ModelFormat format,
                                                             const absl::Status& access) {
  auto* reactor = new ModelDownloadReactor();
  reactor->Start(engine, id, format, access);
  return reactor;
}

grpc::ServerWriteReactor<v1::ModelChunk>* StartCheckpointDownload(engine::Engine* engine,
                                                                  const std::string& id,
                                                                  int32_t epoch,
                                                                  const absl::Status& access) {
  auto* reactor = new ModelDownloadReactor();
  reactor->StartCheckpoint(engine, id, epoch, access);
  return reactor;
}

}  // namespace trainerd::service

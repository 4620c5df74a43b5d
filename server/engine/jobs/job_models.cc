// The files a succeeded job leaves beside its record (job_manager.h): written when it ends
// (KeepModels: its TorchScript model, its state_dict and the digest that says the state_dict is
// whole), found for a download (ModelPath, StateDictPath), and the .pt2 made from the state_dict
// on its first download (Pt2Path).
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/file_io.h"
#include "common/safetensors.h"
#include "common/sha256.h"
#include "server/engine/jobs/job_manager.h"
#include "server/engine/jobs/job_manager_internal.h"
#include "server/engine/log.h"
#include "server/engine/training/sequential_pt2.h"
#include "server/engine/training/torchscript_export.h"

namespace trainerd::engine {

void JobManager::KeepModels(std::vector<EndingRun>& ending) {
  if (options_.models_dir.empty()) return;
  // Made before the files: MakeFoldersDurably is a stat when the folder is there.
  if (absl::Status made = MakeFoldersDurably(options_.models_dir); !made.ok()) {
    for (EndingRun& end : ending) {
      if (end.outcome->state != JobState::kSucceeded) continue;
      end.outcome->state = JobState::kFailed;
      end.outcome->error = absl::StrCat("cannot keep the trained model: ", made.message());
    }
    return;
  }
  // Per succeeded run: its model, then (when it has one that can be stamped) its state_dict and
  // the state_dict's digest, the digest last: its presence says that the state_dict is whole.
  struct Kept {
    EndingRun* end;
    size_t model;                   // index in `files`
    size_t state_dict = 0;          // 0: none
    std::string state_dict_file;    // the stamped bytes
    std::string state_dict_digest;  // hex
  };
  std::vector<Kept> kept;
  kept.reserve(ending.size());
  std::vector<FileToWrite> files;
  const std::string dir = options_.models_dir;
  for (EndingRun& end : ending) {
    if (end.outcome->state != JobState::kSucceeded) continue;
    kept.push_back(Kept{&end, files.size(), 0, "", ""});
    files.push_back({absl::StrCat(dir, "/", end.id, ".pt"), end.outcome->model_archive});
    if (end.outcome->state_dict.empty()) continue;
    // The job's id goes into the file's metadata, which also checks the file (a peer's bytes);
    // a job keeps its TorchScript model without it rather than fail over the second format.
    absl::StatusOr<std::string> stamped =
        SetSafetensorsMetadata(end.outcome->state_dict, "trainerd.job", end.id);
    if (!stamped.ok()) {
      LogWarning(absl::StrCat("job '", end.id,
                              "': its state_dict is not kept: ", stamped.status().message()));
      continue;
    }
    kept.back().state_dict_file = *std::move(stamped);
    kept.back().state_dict_digest = Sha256Hex(kept.back().state_dict_file);
  }
  // The state_dicts' bytes are final now (`files` points into them).
  for (Kept& k : kept) {
    if (k.state_dict_file.empty()) continue;
    k.state_dict = files.size();
    const std::string path = absl::StrCat(dir, "/", k.end->id, ".safetensors");
    files.push_back({path, k.state_dict_file});
    files.push_back({path + ".sha256", k.state_dict_digest});
  }
  const std::vector<absl::Status> written = WriteFilesAtomically(files);
  for (Kept& k : kept) {
    TrainingOutcome& outcome = *k.end->outcome;
    if (!written[k.model].ok()) {
      // A SUCCEEDED job promises a model: it fails (and what else it wrote goes).
      outcome.state = JobState::kFailed;
      outcome.error = absl::StrCat("cannot keep the trained model: ", written[k.model].message());
      if (k.state_dict != 0) {
        job_internal::RemoveFile(files[k.state_dict + 1].path);
        job_internal::RemoveFile(files[k.state_dict].path);
      }
      continue;
    }
    // Kept with the record: a download checks the file against it.
    k.end->model_sha256 = Sha256Hex(outcome.model_archive);
    int64_t bytes = static_cast<int64_t>(outcome.model_archive.size());
    if (k.state_dict != 0) {
      const absl::Status& file = written[k.state_dict];
      const absl::Status& digest = written[k.state_dict + 1];
      if (file.ok() && digest.ok()) {
        bytes += static_cast<int64_t>(k.state_dict_file.size());
      } else {
        // Without its digest a state_dict is not there (StateDictPath); a digest without its
        // file must not be.
        job_internal::RemoveFile(files[k.state_dict + 1].path);
        LogWarning(absl::StrCat("job '", k.end->id, "': its state_dict is not kept: ",
                                (file.ok() ? digest : file).message()));
      }
    }
    if (options_.hooks.wrote_file) options_.hooks.wrote_file(k.end->owner, bytes);
  }
}

absl::StatusOr<std::string> JobManager::ModelPath(const std::string& id) const {
  std::optional<JobState> state;
  {
    absl::MutexLock lock(&mu_);
    if (std::shared_ptr<Record> record = FindLocked(id)) state = record->snap.state;
  }
  if (!state.has_value()) {
    if (store_ == nullptr) return absl::NotFoundError(absl::StrCat("job '", id, "' not found"));
    absl::StatusOr<JobSnapshot> stored = store_->LoadJob(id);
    if (!stored.ok()) return stored.status();
    state = stored->state;
  }
  if (*state != JobState::kSucceeded) {
    return absl::FailedPreconditionError(
        absl::StrCat("job '", id, "' is ", JobStateName(*state),
                     IsTerminal(*state) ? "; only a job that succeeded has a model"
                                        : "; its model is available once it succeeds"));
  }
  if (options_.models_dir.empty()) {
    return absl::FailedPreconditionError("this daemon does not keep trained models");
  }
  // Written before the job was published SUCCEEDED, so the file is complete.
  return absl::StrCat(options_.models_dir, "/", id, ".pt");
}

absl::StatusOr<std::pair<std::string, std::string>> JobManager::StateDictPath(
    const std::string& id) const {
  absl::StatusOr<std::string> archive = ModelPath(id);
  if (!archive.ok()) return archive.status();
  const std::string path = absl::StrCat(options_.models_dir, "/", id, ".safetensors");
  // The digest is written after the file and before the job is published SUCCEEDED: a job
  // without it kept no state_dict.
  absl::StatusOr<std::string> digest = ReadFileToString(path + ".sha256");
  if (!digest.ok()) {
    if (absl::IsNotFound(digest.status())) {
      return absl::FailedPreconditionError(
          absl::StrCat("job '", id,
                       "' has no safetensors state_dict (it was trained by an older trainerd); "
                       "download its TorchScript model, or train it again"));
    }
    return digest.status();
  }
  const bool hex =
      digest->size() == 64 && digest->find_first_not_of("0123456789abcdef") == std::string::npos;
  if (!hex) {
    return absl::DataLossError(
        absl::StrCat("the state_dict checksum of job '", id, "' is damaged; train the job again"));
  }
  return std::make_pair(path, *std::move(digest));
}

absl::StatusOr<std::pair<std::string, std::string>> JobManager::Pt2Path(
    const std::string& id) const {
  absl::StatusOr<std::pair<std::string, std::string>> state_dict = StateDictPath(id);
  if (!state_dict.ok()) return state_dict.status();
  const std::string path = absl::StrCat(options_.models_dir, "/", id, ".pt2");
  absl::MutexLock lock(&pt2_mu_);
  // As the state_dict's: the digest written after the file says that it is whole.
  if (absl::StatusOr<std::string> digest = ReadFileToString(path + ".sha256"); digest.ok()) {
    return std::make_pair(path, *std::move(digest));
  }
  absl::StatusOr<std::string> file = ReadFileToString(state_dict->first);
  if (!file.ok()) return file.status();
  if (Sha256Hex(*file) != state_dict->second) {
    return absl::DataLossError(absl::StrCat("the state_dict of job '", id,
                                            "' does not match the checksum recorded when it was "
                                            "written: it is damaged; train the job again"));
  }
  absl::StatusOr<std::string> pt2 = SequentialPt2(*file);
  if (!pt2.ok()) return pt2.status();
  absl::Status written = WriteModelArchive(path, *pt2);
  const std::string digest = Sha256Hex(*pt2);
  if (written.ok()) written = WriteModelArchive(path + ".sha256", digest);
  if (!written.ok()) return written;
  if (options_.hooks.wrote_file) {
    std::string owner;
    {
      absl::MutexLock records(&mu_);
      if (std::shared_ptr<Record> record = FindLocked(id)) owner = record->snap.owner;
    }
    if (owner.empty() && store_ != nullptr) {
      if (absl::StatusOr<JobSnapshot> stored = store_->LoadJob(id); stored.ok()) {
        owner = stored->owner;
      }
    }
    options_.hooks.wrote_file(owner, static_cast<int64_t>(pt2->size()));
  }
  return std::make_pair(path, digest);
}

}  // namespace trainerd::engine

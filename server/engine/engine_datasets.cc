// The engine's datasets: uploads (begun here, committed on the I/O thread), lookup, listing,
// deletion and sharing over the registry (datasets/), the admission checks of the dataset count
// and the disk quota, a caller's references resolved to keys, and the removal of idle copies for
// peers. The registry's own lock guards its state; admission's lock
// (Admission::mu) orders a deletion against a job's admission.
#include "absl/strings/str_join.h"
#include "server/engine/engine_impl.h"

namespace trainerd::engine {

DiskQuota::Sources Engine::Impl::DiskQuotaSources(const EngineOptions& options) {
  DiskQuota::Sources sources;
  sources.data_dir = options.data_dir;
  sources.dataset_bytes = [this](const std::string& owner) {
    int64_t total = 0;
    for (const DatasetMeta& meta : datasets.List()) {
      total += meta.owner == owner ? meta.size_bytes : 0;
    }
    return total;
  };
  sources.job_ids = [this](const std::string& owner) {
    std::vector<std::string> ids;
    JobQuery query;
    query.owner = owner;
    query.page_size = kMaxJobPageSize;
    // Pages until the end; bounded by the jobs the records keep (--max_finished_jobs).
    while (true) {
      absl::StatusOr<JobPage> page = jobs.List(query);
      if (!page.ok()) break;
      for (const JobSnapshot& job : page->jobs) ids.push_back(job.id);
      if (page->next_page_token.empty()) break;
      query.page_token = page->next_page_token;
    }
    return ids;
  };
  return sources;
}

absl::StatusOr<std::string> Engine::Impl::KeyFor(const std::string& reference,
                                                 const CallContext& caller) const {
  return ResolveDatasetReference(reference, caller.owner);
}

namespace {

// A dataset's NOT_FOUND names at most this many of the datasets the caller may use.
constexpr size_t kDatasetsNamedInNotFound = 10;

// " (the datasets you can use: a, b and 3 more)": the first kDatasetsNamedInNotFound of the
// datasets `caller` may use, as ListDatasets names them to it (its own bare, others' it may use
// as "OWNER/NAME"), in its order; only those, so a NOT_FOUND tells nothing of other tenants'
// datasets that are not shared with it.
std::string UsableDatasetsNote(const DatasetRegistry& datasets, const CallContext& caller) {
  std::vector<std::string> names;
  for (const DatasetMeta& meta : datasets.List()) {
    if (MayUse(caller, meta)) names.push_back(DatasetNameFor(DatasetKeyOf(meta), caller.owner));
  }
  if (names.empty()) return " (there is no dataset you can use: upload one first)";
  std::sort(names.begin(), names.end());
  const size_t shown = std::min(names.size(), kDatasetsNamedInNotFound);
  std::string note = absl::StrCat(
      " (the datasets you can use: ",
      absl::StrJoin(names.begin(), names.begin() + static_cast<std::ptrdiff_t>(shown), ", "));
  if (names.size() > shown) absl::StrAppend(&note, " and ", names.size() - shown, " more");
  return note + ")";
}

}  // namespace

absl::StatusOr<DatasetMeta> Engine::Impl::VisibleDataset(const std::string& key,
                                                         const CallContext& caller) const {
  absl::StatusOr<DatasetMeta> meta = datasets.GetMeta(key);
  // Another tenant's dataset that is not shared is, to this caller, no dataset at all.
  if (!meta.ok() || !MayUse(caller, *meta)) {
    return absl::NotFoundError(absl::StrCat("dataset '", DatasetNameFor(key, caller.owner),
                                            "' not found", UsableDatasetsNote(datasets, caller)));
  }
  return meta;
}

absl::Status Engine::Impl::CheckDatasetCount(const std::string& name,
                                             const CallContext& caller) const {
  const bool per_caller = options.max_datasets_per_caller > 0 && !caller.admin;
  if (options.max_datasets <= 0 && !per_caller) return absl::OkStatus();
  const std::vector<DatasetMeta> kept = datasets.List();
  int64_t owned = 0;
  for (const DatasetMeta& meta : kept) {
    if (meta.owner != caller.owner) continue;
    if (meta.name == name) return absl::OkStatus();  // the registry says it exists
    ++owned;
  }
  if (options.max_datasets > 0 && static_cast<int64_t>(kept.size()) >= options.max_datasets) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the daemon keeps ", kept.size(), " datasets and at most ", options.max_datasets,
        " (--max_datasets); delete datasets that are no longer needed"));
  }
  if (per_caller && owned >= options.max_datasets_per_caller) {
    return absl::ResourceExhaustedError(
        absl::StrCat("caller '", caller.owner, "' owns ", owned, " datasets; its quota is ",
                     options.max_datasets_per_caller,
                     " (--max_datasets_per_caller): delete datasets it no longer needs"));
  }
  return absl::OkStatus();
}

absl::Status Engine::Impl::CheckDiskQuota(const CallContext& caller, int64_t more,
                                          const std::string& what) {
  if (caller.admin) return absl::OkStatus();
  return disk_quota.Check(caller.owner, more, what);
}

int Engine::RemoveIdlePeerCopies() {
  Impl& impl = *impl_;
  if (impl.options.peer_copy_retention <= absl::ZeroDuration()) return 0;
  int removed = 0;
  for (const DatasetMeta& meta :
       impl.datasets.IdleCopies(impl.options.peer_copy_retention, absl::Now())) {
    const std::string key = DatasetKeyOf(meta);
    // Under the admission lock, as a delete is: a job admitted meanwhile keeps it.
    absl::MutexLock lock(&impl.admission.mu());
    if (!impl.jobs.JobUsingDataset(key).empty()) continue;
    absl::StatusOr<DatasetMeta> now = impl.datasets.GetMeta(key);
    if (!now.ok() || !now->peer_copy || now->create_time != meta.create_time) continue;
    // Idle still (a rank may have taken it since the list was made).
    const std::vector<DatasetMeta> idle =
        impl.datasets.IdleCopies(impl.options.peer_copy_retention, absl::Now());
    if (std::none_of(idle.begin(), idle.end(), [&](const DatasetMeta& m) {
          return DatasetKeyOf(m) == key && m.create_time == meta.create_time;
        })) {
      continue;
    }
    if (!impl.datasets.Delete(key).ok()) continue;
    impl.disk_quota.Forget();
    ++removed;
    LogInfo(absl::StrCat("dataset '", key,
                         "', a copy a peer made for its jobs, deleted: no job "
                         "has used it for ",
                         absl::FormatDuration(impl.options.peer_copy_retention),
                         " (--peer_copy_retention)"));
  }
  return removed;
}

absl::StatusOr<std::unique_ptr<UploadSession>> Engine::BeginUpload(const DatasetHeader& header,
                                                                   const CallContext& caller,
                                                                   bool peer_copy) {
  // Refused before a byte is read, rather than received whole and then refused.
  if (!impl_->jobs.accepting()) {
    return absl::UnavailableError(
        "the daemon is shutting down; upload again once it is back (nothing was received)");
  }
  TRAINERD_RETURN_IF_ERROR(impl_->CheckDatasetCount(header.name, caller));
  if (impl_->options.max_dataset_bytes_per_caller > 0 && !caller.admin) {
    // The declared size, checked before anything is received: what the caller owns already plus
    // this upload must fit its quota.
    const absl::StatusOr<DatasetLayout> layout = CheckDatasetHeader(header, 0);
    int64_t owned = 0;
    for (const DatasetMeta& meta : impl_->datasets.List()) {
      owned += meta.owner == caller.owner ? meta.size_bytes : 0;
    }
    if (layout.ok() && owned + layout->total_bytes > impl_->options.max_dataset_bytes_per_caller) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "caller '", caller.owner, "' owns ", owned, " bytes of datasets and this one declares ",
          layout->total_bytes, "; its quota is ", impl_->options.max_dataset_bytes_per_caller,
          " bytes (--max_dataset_bytes_per_caller): delete datasets it no longer needs"));
    }
  }
  if (impl_->options.max_disk_bytes_per_caller > 0 && !caller.admin) {
    // The declared size again, against what the caller holds on disk.
    const absl::StatusOr<DatasetLayout> layout = CheckDatasetHeader(header, 0);
    if (layout.ok()) {
      TRAINERD_RETURN_IF_ERROR(impl_->CheckDiskQuota(caller, layout->total_bytes, "this upload"));
    }
  }
  TRAINERD_ASSIGN_OR_RETURN(std::unique_ptr<DatasetUpload> upload,
                            impl_->datasets.BeginUpload(header, caller.owner, peer_copy));
  return std::unique_ptr<UploadSession>(std::move(upload));
}

int64_t Engine::staged_upload_bytes() const { return impl_->datasets.staged_bytes(); }

absl::StatusOr<DatasetMeta> Engine::CommitUpload(std::unique_ptr<UploadSession> session) {
  // Every UploadSession comes from BeginUpload, which makes DatasetUploads.
  std::unique_ptr<DatasetUpload> upload(static_cast<DatasetUpload*>(session.release()));
  const std::string key = DatasetKeyOf(upload->meta());
  const bool peer_copy = upload->meta().peer_copy;
  auto meta = impl_->datasets.Commit(std::move(upload));
  if (meta.ok()) {
    impl_->disk_quota.Forget();  // the new dataset counts at the owner's next call
    LogInfo(absl::StrCat("dataset '", key, "'", peer_copy ? " (a copy for a peer's jobs)" : "",
                         " resident on ", meta->device, ": ", meta->rows, " rows, ",
                         meta->size_bytes, " bytes"));
  }
  return meta;
}

void Engine::CommitUploadAsync(std::unique_ptr<UploadSession> upload,
                               std::function<void(absl::StatusOr<DatasetMeta>)> done) {
  // std::function needs a copyable callable; the upload moves into a shared holder.
  auto holder = std::make_shared<std::unique_ptr<UploadSession>>(std::move(upload));
  {
    std::lock_guard<std::mutex> lock(impl_->io_mu);
    if (!impl_->io_stopping) {
      impl_->io_tasks.push_back(
          [this, holder, done = std::move(done)] { done(CommitUpload(std::move(*holder))); });
      impl_->io_cv.notify_one();
      return;
    }
  }
  done(absl::UnavailableError("the daemon is shutting down"));
}

absl::StatusOr<DatasetMeta> Engine::GetDataset(const std::string& name, const CallContext& caller) {
  TRAINERD_ASSIGN_OR_RETURN(const std::string key, impl_->KeyFor(name, caller));
  TRAINERD_ASSIGN_OR_RETURN(DatasetMeta meta, impl_->VisibleDataset(key, caller));
  if (meta.peer_copy) impl_->datasets.TouchCopies({key});
  return meta;
}

std::vector<DatasetMeta> Engine::ListDatasets() const { return impl_->datasets.List(); }

absl::Status Engine::DeleteDataset(const std::string& name, const CallContext& caller) {
  TRAINERD_ASSIGN_OR_RETURN(const std::string key, impl_->KeyFor(name, caller));
  absl::MutexLock lock(&impl_->admission.mu());
  TRAINERD_ASSIGN_OR_RETURN(const DatasetMeta meta, impl_->VisibleDataset(key, caller));
  TRAINERD_RETURN_IF_ERROR(CheckMayManage(caller, meta));
  const std::string job = impl_->jobs.JobUsingDataset(key);
  if (!job.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "dataset '", name, "' is in use by job '", job, "'; cancel the job or wait for it to end"));
  }
  TRAINERD_RETURN_IF_ERROR(impl_->datasets.Delete(key));
  impl_->disk_quota.Forget();  // the owner's room is back at its next call
  LogInfo(absl::StrCat("dataset '", key, "' deleted"));
  return absl::OkStatus();
}

absl::StatusOr<DatasetMeta> Engine::ShareDataset(const std::string& name, bool shared,
                                                 const CallContext& caller) {
  TRAINERD_ASSIGN_OR_RETURN(const std::string key, impl_->KeyFor(name, caller));
  // Under the admission lock, as a delete is: the owner checked is the owner changed.
  absl::MutexLock lock(&impl_->admission.mu());
  TRAINERD_ASSIGN_OR_RETURN(const DatasetMeta meta, impl_->VisibleDataset(key, caller));
  TRAINERD_RETURN_IF_ERROR(CheckMayManage(caller, meta));
  return impl_->datasets.SetShared(key, shared);
}

}  // namespace trainerd::engine

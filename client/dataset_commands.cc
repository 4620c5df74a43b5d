// trainctl's dataset commands: dataset upload (CSV or .npy, sent in chunks with a progress bar),
// list, get, rm, share and unshare.
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "client/cli.h"
#include "client/command_support.h"
#include "client/connection.h"
#include "client/output.h"
#include "client/progress_bar.h"
#include "client/upload_input.h"
#include "client/upload_stream.h"
#include "common/dataset_header.h"
#include "common/sha256.h"
#include "common/table.h"
#include "grpcpp/client_context.h"
#include "grpcpp/support/status.h"
#include "trainerd/v1/datasets.pb.h"

namespace trainerd::client {
namespace {

// Gives the next bytes of an upload's payload: fills `out` with `size` bytes (fewer only at its
// end) and says how many.
using PayloadReader = std::function<absl::StatusOr<size_t>(char* out, size_t size)>;

// Sends an upload: `header`, the `total_bytes` of payload that `read` gives in chunks of at most
// kUploadChunkBytes, and with `sha256_trailer` a last message with the SHA-256 of the bytes sent
// (for a payload checksummed as it is read; the header's sha256 is then empty). The first chunk is
// read before the call starts, so that a bad value in it is refused as before any other call; a
// read error after that cancels the call (the daemon registers nothing) and is still a local
// error (exit 2). Once the daemon has the dataset, `notes` (what the upload converted) go to
// stderr.
int SendUpload(const CommandContext& context, const v1::DatasetHeader& header, int64_t total_bytes,
               const PayloadReader& read, bool sha256_trailer,
               const std::vector<std::string>& notes) {
  v1::UploadDatasetRequest chunk_request;
  std::string& chunk = *chunk_request.mutable_chunk();
  Sha256 sha256;
  int64_t read_bytes = 0;
  // Reads the next chunk into `chunk` (and the checksum).
  const auto read_chunk = [&]() -> absl::Status {
    const size_t size = static_cast<size_t>(
        std::min(static_cast<int64_t>(kUploadChunkBytes), total_bytes - read_bytes));
    chunk.resize(size);
    absl::StatusOr<size_t> got = read(chunk.data(), size);
    if (!got.ok()) return got.status();
    if (*got != size) {
      return absl::DataLossError(absl::StrCat("the payload ended after ", read_bytes + *got, " of ",
                                              total_bytes, " bytes"));
    }
    if (sha256_trailer) sha256.Update(chunk);
    read_bytes += static_cast<int64_t>(size);
    return absl::OkStatus();
  };
  if (absl::Status first = read_chunk(); !first.ok()) return UsageFailure(first);

  const absl::Duration timeout = std::max(kUploadTimeout, context.invocation.global.timeout);
  grpc::ClientContext call;
  Connection::SetDeadline(&call, timeout);
  v1::Dataset dataset;
  std::unique_ptr<grpc::ClientWriter<v1::UploadDatasetRequest>> writer =
      context.connection.datasets().UploadDataset(&call, &dataset);

  ProgressBar progress(total_bytes, isatty(STDERR_FILENO) == 1, stderr);
  // A failed Write means the stream is over (the daemon rejected it or the connection broke);
  // Finish then says why.
  progress.Update(0);
  v1::UploadDatasetRequest request;
  *request.mutable_header() = header;
  bool open = writer->Write(request);
  int64_t sent = 0;
  while (open) {
    open = writer->Write(chunk_request);
    if (!open) break;
    sent += static_cast<int64_t>(chunk.size());
    progress.Update(sent);
    if (sent == total_bytes) break;
    if (absl::Status next = read_chunk(); !next.ok()) {
      call.TryCancel();
      writer->Finish();
      progress.Finish();
      return UsageFailure(next);
    }
  }
  if (open && sha256_trailer) {
    request.set_sha256(sha256.HexDigest());
    open = writer->Write(request);
  }
  if (open) writer->WritesDone();
  const grpc::Status status = writer->Finish();
  progress.Finish();
  if (!status.ok()) return RpcFailure(context, status, timeout);
  // What was converted, on stderr once the daemon has the dataset (a failed upload says only why).
  for (const std::string& note : notes) std::cerr << "trainctl: " << note << std::endl;
  if (context.names) return PrintNames({dataset.name()});
  if (context.structured) return PrintMessage(context, dataset);
  // One line suits a loop of uploads; -o wide (or `dataset get`) shows the whole description.
  return PrintText(context.format == OutputFormat::kWide ? DatasetDetails(dataset)
                                                         : DatasetUploadedLine(dataset));
}

}  // namespace

int DatasetUpload(const CommandContext& context) {
  const std::string& name = context.invocation.args.at(0);
  if (name.find('/') != std::string::npos) {
    return UsageFailure(absl::InvalidArgumentError(
        "a dataset is uploaded under a bare NAME, as one of yours (OWNER/NAME names another "
        "owner's dataset in the other commands)"));
  }
  if (absl::Status status = ValidateDatasetName(name); !status.ok()) return UsageFailure(status);
  absl::StatusOr<UploadInput> input = UploadInputFromFlags(context.invocation);
  if (!input.ok()) return UsageFailure(input.status());

  if (CanStreamUpload(*input)) {
    // .npy files: read, converted and checksummed a block at a time as they are sent, so that
    // trainctl holds a few MiB rather than the files; the checksum goes last.
    absl::StatusOr<std::unique_ptr<NpyUploadStream>> stream = NpyUploadStream::Open(*input);
    if (!stream.ok()) return UsageFailure(stream.status());
    DatasetHeader header = (*stream)->header();
    header.name = name;
    if (absl::Status limits = CheckUploadAgainstLimits(header); !limits.ok()) {
      return UsageFailure(limits);
    }
    NpyUploadStream& source = **stream;
    return SendUpload(
        context, MakeDatasetHeader(header), source.total_bytes(),
        [&source](char* out, size_t size) { return source.Read(out, size); },
        /*sha256_trailer=*/true, source.notes());
  }

  // CSV (and .npy from a pipe or a device): the whole table is read, checked and encoded first, so
  // its checksum goes in the header.
  std::vector<std::string> notes;
  absl::StatusOr<Table> table = ReadUploadInput(*input, &notes);
  if (!table.ok()) return UsageFailure(table.status());
  if (absl::Status limits = CheckUploadAgainstLimits(name, *table); !limits.ok()) {
    return UsageFailure(limits);
  }
  const std::string payload = EncodePayload(*table);
  size_t offset = 0;
  return SendUpload(
      context, MakeDatasetHeader(name, *table, Sha256Hex(payload)),
      static_cast<int64_t>(payload.size()),
      [&](char* out, size_t size) -> absl::StatusOr<size_t> {
        const size_t n = std::min(size, payload.size() - offset);
        std::memcpy(out, payload.data() + offset, n);
        offset += n;
        return n;
      },
      /*sha256_trailer=*/false, notes);
}

int DatasetList(const CommandContext& context) {
  v1::ListDatasetsResponse response;
  if (int failed = CallOrFail(context, context.connection.datasets(),
                              &v1::DatasetService::Stub::ListDatasets, v1::ListDatasetsRequest(),
                              &response)) {
    return failed;
  }
  if (context.names) {
    std::vector<std::string> names;
    for (const v1::Dataset& dataset : response.datasets()) names.push_back(dataset.name());
    return PrintNames(names);
  }
  return context.structured ? PrintMessage(context, response)
                            : PrintText(DatasetListTable(response, context.table));
}

int DatasetGet(const CommandContext& context) {
  v1::GetDatasetRequest request;
  request.set_name(context.invocation.args.at(0));
  v1::Dataset dataset;
  if (int failed = CallOrFail(context, context.connection.datasets(),
                              &v1::DatasetService::Stub::GetDataset, request, &dataset)) {
    return failed;
  }
  if (context.names) return PrintNames({dataset.name()});
  return context.structured ? PrintMessage(context, dataset) : PrintText(DatasetDetails(dataset));
}

int DatasetRemove(const CommandContext& context) {
  v1::DeleteDatasetRequest request;
  request.set_name(context.invocation.args.at(0));
  v1::DeleteDatasetResponse response;
  if (int failed = CallOrFail(context, context.connection.datasets(),
                              &v1::DatasetService::Stub::DeleteDataset, request, &response)) {
    return failed;
  }
  if (context.names) return PrintNames({request.name()});
  return context.structured ? PrintMessage(context, response)
                            : PrintText(absl::StrCat("deleted dataset '", request.name(), "'\n"));
}

// dataset share / dataset unshare.
int DatasetShare(const CommandContext& context, bool shared) {
  v1::ShareDatasetRequest request;
  request.set_name(context.invocation.args.at(0));
  request.set_shared(shared);
  v1::Dataset dataset;
  if (int failed = CallOrFail(context, context.connection.datasets(),
                              &v1::DatasetService::Stub::ShareDataset, request, &dataset)) {
    return failed;
  }
  if (context.names) return PrintNames({dataset.name()});
  return context.structured ? PrintMessage(context, dataset)
                            : PrintText(absl::StrCat(shared ? "shared" : "unshared", " dataset '",
                                                     dataset.name(), "'\n"));
}

}  // namespace trainerd::client

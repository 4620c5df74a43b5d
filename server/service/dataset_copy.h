// A dataset sent from this daemon to a peer that lacks it (peer_client.cc's CopyDataset): the
// peer's public UploadDataset, as any client's upload, so that the peer checks, checksums and
// stores it as it does every upload.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "grpcpp/grpcpp.h"
#include "server/engine/types.h"
#include "trainerd/v1/datasets.grpc.pb.h"

namespace trainerd::service {

// Streams `meta`'s payload, read from the dataset file `path` from `payload_offset` on, to the
// peer behind `stub` as an upload named `name_there` ("OWNER/NAME": the tenant's there, which an
// admin's credentials may upload) marked for_peer_jobs, with the SHA-256 in its header, in chunks
// of the API's largest (1 MiB). `prepare` readies the call's context (credentials, deadline);
// `describe` turns a failed call into the sentence that names the peer. OK once the peer answered
// with the same SHA-256. A file that cannot be read is INTERNAL naming it (the peer then discards
// what it received).
absl::Status SendDataset(v1::DatasetService::Stub* stub, const std::string& name_there,
                         const engine::DatasetMeta& meta, const std::string& path,
                         int64_t payload_offset,
                         const std::function<void(grpc::ClientContext*)>& prepare,
                         const std::function<absl::Status(const grpc::Status&)>& describe);

}  // namespace trainerd::service

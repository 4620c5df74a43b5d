"""trainerd's API, package trainerd.v1: the modules protoc generates from proto/trainerd/v1/
when the package is built (datasets_pb2, jobs_pb2, system_pb2 and their *_pb2_grpc stubs)."""

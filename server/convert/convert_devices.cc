// The device side of the conversions (convert.h): a job's DeviceReport both ways, a device's
// status and Diagnose's figures. Apart from convert.cc, which holds the datasets' and jobs'.
#include "server/convert/convert.h"

namespace trainerd::convert {

v1::WorkerSandbox ToProto(const SandboxReport& r) {
  v1::WorkerSandbox out;
  out.set_program(r.program);
  out.set_landlock_abi(r.landlock_abi);
  out.set_landlock(r.landlock);
  out.set_seccomp(r.seccomp);
  out.set_no_new_privileges(r.no_new_privileges);
  out.set_not_dumpable(r.not_dumpable);
  out.set_network_namespace(r.network_namespace);
  out.set_uid(r.uid);
  out.set_other_user(r.other_user);
  out.set_landlock_error(r.landlock_error);
  out.set_seccomp_error(r.seccomp_error);
  out.set_network_error(r.network_error);
  return out;
}

SandboxReport FromProto(const v1::WorkerSandbox& s) {
  SandboxReport out;
  out.program = s.program();
  out.landlock_abi = s.landlock_abi();
  out.landlock = s.landlock();
  out.seccomp = s.seccomp();
  out.no_new_privileges = s.no_new_privileges();
  out.not_dumpable = s.not_dumpable();
  out.network_namespace = s.network_namespace();
  out.uid = s.uid();
  out.other_user = s.other_user();
  out.landlock_error = s.landlock_error();
  out.seccomp_error = s.seccomp_error();
  out.network_error = s.network_error();
  return out;
}

v1::WorkerSandbox ToProto(const engine::WorkerSandboxStatus& status) {
  v1::WorkerSandbox out = ToProto(status.report);
  for (const std::string& part : status.missing) out.add_missing(part);
  for (const std::string& part : status.accepted_missing) out.add_accepted_missing(part);
  out.set_refusal(status.refusal);
  if (status.measured_at != absl::InfinitePast()) {
    SetTimestamp(status.measured_at, out.mutable_measure_time());
  }
  return out;
}

v1::DeviceReport ToProto(const engine::DeviceReport& r) {
  v1::DeviceReport out;
  out.set_queue_seconds(r.queue_seconds);
  out.set_data_seconds(r.data_seconds);
  out.set_compute_seconds(r.compute_seconds);
  out.set_host_transfer_seconds(r.host_transfer_seconds);
  if (r.utilization_average) out.set_utilization_average(*r.utilization_average);
  if (r.utilization_peak) out.set_utilization_peak(*r.utilization_peak);
  out.set_peak_memory_bytes(r.peak_memory_bytes);
  out.set_steps_per_second(r.steps_per_second);
  out.set_host_syncs(r.host_syncs);
  out.set_host_to_device_bytes(r.host_to_device_bytes);
  out.set_flops_per_step(r.flops_per_step);
  out.set_achieved_flops_per_second(r.achieved_flops_per_second);
  if (r.peak_fraction) out.set_peak_fraction(*r.peak_fraction);
  if (r.overhead_fraction) out.set_overhead_fraction(*r.overhead_fraction);
  out.set_intra_op_threads(r.intra_op_threads);
  out.set_engine(r.engine);
  out.set_engine_reason(r.engine_reason);
  out.set_packed_members(r.packed_members);
  out.set_packed_bitwise(r.packed_bitwise);
  out.set_packed_numerics(r.packed_numerics);
  out.set_worker_start_seconds(r.worker_start_seconds);
  out.set_collective_seconds(r.collective_seconds);
  if (r.collective_fraction) out.set_collective_fraction(*r.collective_fraction);
  if (r.worker_sandbox) *out.mutable_worker_sandbox() = ToProto(*r.worker_sandbox);
  switch (r.bound) {
    case engine::SpeedBound::kUnspecified:
      out.set_bound(v1::DeviceReport::BOUND_UNSPECIFIED);
      break;
    case engine::SpeedBound::kLaunchBound:
      out.set_bound(v1::DeviceReport::LAUNCH_BOUND);
      break;
    case engine::SpeedBound::kComputeBound:
      out.set_bound(v1::DeviceReport::COMPUTE_BOUND);
      break;
    case engine::SpeedBound::kTransferBound:
      out.set_bound(v1::DeviceReport::TRANSFER_BOUND);
      break;
    case engine::SpeedBound::kDataBound:
      out.set_bound(v1::DeviceReport::DATA_BOUND);
      break;
    case engine::SpeedBound::kBalanced:
      out.set_bound(v1::DeviceReport::BALANCED);
      break;
    case engine::SpeedBound::kCommunicationBound:
      out.set_bound(v1::DeviceReport::COMMUNICATION_BOUND);
      break;
  }
  out.set_verdict(r.verdict);
  return out;
}

v1::DeviceStatus ToProto(const engine::DeviceStatusInfo& d) {
  v1::DeviceStatus out;
  out.set_device(d.device);
  out.set_name(d.name);
  out.set_uuid(d.uuid);
  if (d.utilization) out.set_utilization(*d.utilization);
  out.set_memory_used_bytes(d.memory_used_bytes);
  out.set_memory_total_bytes(d.memory_total_bytes);
  for (const std::string& name : d.datasets) out.add_datasets(name);
  out.set_dataset_bytes(d.dataset_bytes);
  for (const std::string& id : d.running_jobs) out.add_running_jobs(id);
  out.set_queued_jobs(d.queued_jobs);
  for (const std::string& rank : d.peer_ranks) out.add_peer_ranks(rank);
  out.set_is_default(d.is_default);
  out.set_unusable_reason(d.unusable_reason);
  return out;
}

v1::DiagnoseResponse ToProto(const engine::Diagnosis& d) {
  v1::DiagnoseResponse out;
  out.set_libtorch_version(d.libtorch_version);
  out.set_cuda_version(d.cuda_version);
  out.set_driver_version(d.driver_version);
  for (const engine::DeviceDiagnosis& dd : d.devices) {
    v1::DeviceDiagnosis* o = out.add_devices();
    o->set_device(dd.device);
    o->set_name(dd.name);
    o->set_memory_total_bytes(dd.memory_total_bytes);
    o->set_matmul_size(dd.matmul_size);
    o->set_matmul_flops_per_second(dd.matmul_flops_per_second);
    o->set_host_to_device_bytes_per_second(dd.host_to_device_bytes_per_second);
    o->set_launch_seconds(dd.launch_seconds);
    o->set_sync_seconds(dd.sync_seconds);
    if (dd.utilization_during_matmul) {
      o->set_utilization_during_matmul(*dd.utilization_during_matmul);
    }
    if (dd.sm_activity_during_matmul) {
      o->set_sm_activity_during_matmul(*dd.sm_activity_during_matmul);
    }
  }
  if (d.measure_time != absl::InfinitePast()) {
    SetTimestamp(d.measure_time, out.mutable_measure_time());
  }
  out.set_cached(d.cached);
  return out;
}

engine::DeviceReport FromProto(const v1::DeviceReport& r) {
  engine::DeviceReport out;
  out.queue_seconds = r.queue_seconds();
  out.data_seconds = r.data_seconds();
  out.compute_seconds = r.compute_seconds();
  out.host_transfer_seconds = r.host_transfer_seconds();
  if (r.has_utilization_average()) out.utilization_average = r.utilization_average();
  if (r.has_utilization_peak()) out.utilization_peak = r.utilization_peak();
  out.peak_memory_bytes = r.peak_memory_bytes();
  out.steps_per_second = r.steps_per_second();
  out.host_syncs = r.host_syncs();
  out.host_to_device_bytes = r.host_to_device_bytes();
  out.flops_per_step = r.flops_per_step();
  out.achieved_flops_per_second = r.achieved_flops_per_second();
  if (r.has_peak_fraction()) out.peak_fraction = r.peak_fraction();
  if (r.has_overhead_fraction()) out.overhead_fraction = r.overhead_fraction();
  out.intra_op_threads = r.intra_op_threads();
  out.engine = r.engine();
  out.engine_reason = r.engine_reason();
  out.packed_members = r.packed_members();
  out.packed_bitwise = r.packed_bitwise();
  out.packed_numerics = r.packed_numerics();
  out.worker_start_seconds = r.worker_start_seconds();
  out.collective_seconds = r.collective_seconds();
  if (r.has_collective_fraction()) out.collective_fraction = r.collective_fraction();
  if (r.has_worker_sandbox()) out.worker_sandbox = FromProto(r.worker_sandbox());
  switch (r.bound()) {
    case v1::DeviceReport::LAUNCH_BOUND:
      out.bound = engine::SpeedBound::kLaunchBound;
      break;
    case v1::DeviceReport::COMPUTE_BOUND:
      out.bound = engine::SpeedBound::kComputeBound;
      break;
    case v1::DeviceReport::TRANSFER_BOUND:
      out.bound = engine::SpeedBound::kTransferBound;
      break;
    case v1::DeviceReport::DATA_BOUND:
      out.bound = engine::SpeedBound::kDataBound;
      break;
    case v1::DeviceReport::BALANCED:
      out.bound = engine::SpeedBound::kBalanced;
      break;
    case v1::DeviceReport::COMMUNICATION_BOUND:
      out.bound = engine::SpeedBound::kCommunicationBound;
      break;
    default:
      out.bound = engine::SpeedBound::kUnspecified;
  }
  out.verdict = r.verdict();
  return out;
}

}  // namespace trainerd::convert

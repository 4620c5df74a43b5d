#include "server/engine/trainer.h"

#include <chrono>
#include <cmath>
#include <mutex>

#include <ATen/CPUGeneratorImpl.h>

#include "absl/strings/str_cat.h"
#include "server/engine/device.h"
#include "server/engine/loss.h"
#include "server/engine/model.h"
#include "server/engine/optimizer.h"

namespace trainerd::engine {
namespace {

// Module initialisation draws from LibTorch's process-wide CPU generator. Seeding it and building
// the model happen under this lock so that concurrent jobs on different devices each get exactly
// their own seed's initial weights.
std::mutex& InitMutex() {
  static std::mutex* mu = new std::mutex;
  return *mu;
}

// Every copy from the device to the host goes through here, so host_syncs is an exact count.
class HostTransfers {
 public:
  torch::Tensor ToHost(const torch::Tensor& t) {
    ++count_;
    return t.to(torch::kCPU);
  }
  void CountCrossDeviceCopy() { ++count_; }
  int64_t count() const { return count_; }

 private:
  int64_t count_ = 0;
};

// The job's generator on its device (shuffling, dropout). The CPU gets a generator of its own; a
// CUDA device's default generator belongs to that device's single worker thread.
at::Generator JobGenerator(const torch::Device& device, uint64_t seed) {
  if (device.is_cpu()) return at::detail::createCPUGenerator(seed);
  at::Generator gen = at::globalContext().defaultGenerator(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_current_seed(seed);
  return gen;
}

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

TrainingOutcome RunTraining(const TrainingRun& run) {
  TrainingOutcome outcome;
  HostTransfers host;
  const auto start = std::chrono::steady_clock::now();
  const JobSpec& spec = run.spec;
  const uint64_t seed = spec.seed.value_or(0);
  try {
    // The job's own generator on its device: shuffling and any random layer (dropout) draw from it.
    at::Generator gen = JobGenerator(run.device, seed);
    torch::nn::Sequential model;
    {
      std::lock_guard<std::mutex> lock(InitMutex());
      // Not under the generator's own mutex: the initialisers below take it themselves.
      at::Generator cpu_gen = at::detail::getDefaultCPUGenerator();
      cpu_gen.set_current_seed(seed);
      model = BuildModel(run.model, run.dataset->meta.feature_shape, gen);
    }
    model->to(run.device);
    model->train();
    const std::vector<torch::Tensor> parameters = model->parameters();
    auto optimizer = MakeOptimizer(spec, parameters);

    // The dataset normally lives on the job's device already; a job on another device gets one
    // copy at start, never one per batch.
    torch::Tensor features = run.dataset->features;
    torch::Tensor targets = run.dataset->targets;
    if (features.device() != run.device) {
      host.CountCrossDeviceCopy();
      features = features.to(run.device);
      targets = targets.to(run.device);
    }

    const int64_t rows = features.size(0);
    const int64_t batch = std::min<int64_t>(spec.batch_size, rows);
    const auto index_options = torch::TensorOptions(torch::kInt64).device(run.device);
    // Accumulates sum(batch mean loss * batch rows) over the epoch, on the device.
    torch::Tensor loss_sum = torch::zeros({}, torch::TensorOptions(torch::kFloat64).device(run.device));

    for (int32_t epoch = 1; epoch <= spec.epochs; ++epoch) {
      // The schedule is host arithmetic on the epoch number: no device value is read.
      const double learning_rate = LearningRateForEpoch(spec, epoch);
      SetLearningRate(*optimizer, learning_rate);
      torch::Tensor perm;
      if (spec.shuffle) perm = torch::randperm(rows, gen, index_options);
      loss_sum.zero_();
      for (int64_t begin = 0; begin < rows; begin += batch) {
        if (run.cancel != nullptr && run.cancel->load(std::memory_order_relaxed)) {
          outcome.state = JobState::kCancelled;
          outcome.wall_seconds = SecondsSince(start);
          outcome.host_syncs = host.count();
          return outcome;
        }
        const int64_t len = std::min(batch, rows - begin);
        torch::Tensor x, y;
        if (spec.shuffle) {
          torch::Tensor idx = perm.narrow(/*dim=*/0, begin, len);
          x = features.index_select(/*dim=*/0, idx);
          y = targets.index_select(/*dim=*/0, idx);
        } else {
          x = features.narrow(/*dim=*/0, begin, len);
          y = targets.narrow(/*dim=*/0, begin, len);
        }
        optimizer->zero_grad();
        torch::Tensor loss = ComputeLoss(spec, model->forward(x), y);
        loss.backward();
        // Clipping scales the gradients by a device scalar; its norm never reaches the host.
        if (spec.clip_grad_norm > 0) ClipGradNorm(parameters, spec.clip_grad_norm);
        optimizer->step();
        {
          torch::NoGradGuard no_grad;
          loss_sum.add_(loss.detach(), /*alpha=*/static_cast<double>(len));
        }
        ++outcome.steps;
      }
      // The epoch's one host transfer.
      const double mean_loss =
          host.ToHost(loss_sum / static_cast<double>(rows)).item<double>();
      outcome.epochs_done = epoch;
      outcome.final_loss = mean_loss;
      if (!std::isfinite(mean_loss)) {
        outcome.state = JobState::kFailed;
        outcome.error = absl::StrCat("loss became ", std::isnan(mean_loss) ? "NaN" : "infinite",
                                     " at epoch ", epoch,
                                     "; try a smaller learning rate (", spec.learning_rate, ")");
        outcome.wall_seconds = SecondsSince(start);
        outcome.host_syncs = host.count();
        return outcome;
      }
      if (run.on_epoch) {
        run.on_epoch(EpochResult{epoch, mean_loss, SecondsSince(start), learning_rate},
                     outcome.steps, host.count());
      }
    }

    // Read the trained parameters back in one transfer when the model is small.
    std::vector<torch::Tensor> flat;
    for (const auto& p : model->named_parameters()) {
      outcome.parameter_count += p.value().numel();
      flat.push_back(p.value().detach().reshape({-1}));
    }
    if (outcome.parameter_count > 0 && outcome.parameter_count <= kMaxReportedParameters) {
      torch::Tensor all = host.ToHost(torch::cat(flat).to(torch::kFloat32)).contiguous();
      const float* data = all.data_ptr<float>();
      int64_t offset = 0;
      for (const auto& p : model->named_parameters()) {
        ParameterValues values;
        values.name = p.key();
        values.shape = p.value().sizes().vec();
        const int64_t n = p.value().numel();
        values.values.assign(data + offset, data + offset + n);
        offset += n;
        outcome.parameters.push_back(std::move(values));
      }
    }
    outcome.state = JobState::kSucceeded;
  } catch (const c10::OutOfMemoryError& e) {
    outcome.state = JobState::kFailed;
    outcome.error = absl::StrCat("out of memory on ", DeviceName(run.device), " at epoch ",
                                 outcome.epochs_done + 1,
                                 "; try a smaller batch size or model");
  } catch (const std::exception& e) {
    outcome.state = JobState::kFailed;
    std::string what = e.what();
    // LibTorch appends a C++ backtrace to its messages; the first line is the sentence.
    what = what.substr(0, what.find('\n'));
    outcome.error = absl::StrCat("training failed at epoch ", outcome.epochs_done + 1, ": ", what);
  }
  outcome.wall_seconds = SecondsSince(start);
  outcome.host_syncs = host.count();
  return outcome;
}

}  // namespace trainerd::engine

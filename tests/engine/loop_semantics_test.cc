// The epoch loop's rules as a PyTorch user reads them in jobs.proto and docs/JOBS.md, checked against
// a plain LibTorch loop written from those rules alone (torch::nn layers, torch::optim::SGD, the
// documented generator draws): no shuffling takes the rows in ascending order, the held-out count
// rounds halves away from zero, dropout masks come from the job's generator in the documented
// order, gradient accumulation is the usual `(loss / N).backward()` loop, drop_last drops the short
// last batch, and early stopping's min_delta and accuracy metric follow Keras' EarlyStopping.
#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/model_spec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/engine/training/checkpoint.h"
#include "server/engine/training/model.h"
#include "server/engine/training/trainer.h"
#include "tests/engine/engine_test_support.h"

namespace trainerd::engine {
namespace {

using ::testing::HasSubstr;

// `rows` rows of 5 standard-normal features; float targets (a noisy nonlinear function) or, with
// `classes` > 0, int64 classes of the features' sums.
std::shared_ptr<const Dataset> MakeDataset(int64_t rows, int64_t classes = 0) {
  auto dataset = std::make_shared<Dataset>();
  dataset->meta.name = "loop";
  dataset->meta.feature_shape = {5};
  dataset->meta.rows = rows;
  dataset->meta.device = "cpu";
  at::Generator gen = at::detail::createCPUGenerator(99);
  dataset->features = torch::randn({rows, 5}, gen);
  if (classes > 0) {
    dataset->meta.target_shape = {};
    dataset->meta.target_dtype = TargetDType::kInt64;
    const torch::Tensor noisy = dataset->features.sum(1) + 0.8 * torch::randn({rows}, gen);
    dataset->targets =
        ((noisy.clamp(-3, 2.999) + 3) * (static_cast<double>(classes) / 6)).to(torch::kInt64);
  } else {
    dataset->meta.target_shape = {1};
    dataset->targets = (dataset->features.narrow(1, 0, 2).prod(1, /*keepdim=*/true).sin() +
                        0.1 * torch::randn({rows, 1}, gen));
  }
  return dataset;
}

TrainingRun MakeRun(std::shared_ptr<const Dataset> dataset, const std::string& model) {
  TrainingRun run;
  run.spec.dataset = "loop";
  run.spec.model = model;
  run.spec.loss =
      dataset->targets.scalar_type() == torch::kInt64 ? LossKind::kCrossEntropy : LossKind::kMse;
  run.spec.optimizer = OptimizerKind::kSgd;
  run.spec.learning_rate = 0.05;
  run.spec.momentum = 0.9;
  run.spec.batch_size = 7;
  run.spec.epochs = 4;
  run.spec.seed = 1234;
  run.spec.device = "cpu";
  run.spec.engine = EngineKind::kLibTorch;
  run.model = *ParseModelSpec(model);
  run.dataset = std::move(dataset);
  return run;
}

struct Recorded {
  TrainingOutcome outcome;
  std::vector<EpochResult> epochs;
};

Recorded Train(TrainingRun run) {
  Recorded recorded;
  run.on_epoch = [&](const EpochResult& e, int64_t, int64_t) { recorded.epochs.push_back(e); };
  recorded.outcome = RunTraining(run);
  return recorded;
}

// What the reference loop reports.
struct Reference {
  std::vector<double> losses;
  std::vector<double> validation_losses;
  std::vector<double> validation_accuracies;
  std::vector<torch::Tensor> parameters;  // in the model's order
  int64_t steps = 0;
};

// The layers of a model spec of linear, relu and dropout layers, built as a PyTorch user would:
// torch.manual_seed(seed), then each layer in order (only linear layers draw).
struct ReferenceModel {
  std::vector<LayerSpec> layers;
  std::vector<torch::nn::Linear> linears;  // one per linear layer, in order

  ReferenceModel(const ModelSpec& spec, int64_t in, uint64_t seed) : layers(spec.layers) {
    torch::manual_seed(seed);
    for (const LayerSpec& layer : layers) {
      if (layer.kind != LayerKind::kLinear) continue;
      linears.emplace_back(torch::nn::Linear(in, layer.args[0]));
      in = layer.args[0];
    }
  }

  std::vector<torch::Tensor> parameters() const {
    std::vector<torch::Tensor> out;
    for (const auto& l : linears) {
      out.push_back(l->weight);
      out.push_back(l->bias);
    }
    return out;
  }

  // Dropout as documented: mask = torch.empty_like(x).bernoulli_(1 - p, generator=g), the output
  // x * (mask / (1 - p)); the identity out of training.
  torch::Tensor forward(torch::Tensor x, bool training, at::Generator& gen) {
    size_t linear = 0;
    for (const LayerSpec& layer : layers) {
      switch (layer.kind) {
        case LayerKind::kLinear:
          x = linears[linear++]->forward(x);
          break;
        case LayerKind::kRelu:
          x = torch::relu(x);
          break;
        case LayerKind::kDropout:
          if (training) {
            const double keep = 1.0 - layer.rate;
            const torch::Tensor mask = torch::empty_like(x).bernoulli_(keep, gen);
            x = x * (mask / keep);
          }
          break;
        default:
          ADD_FAILURE() << "the reference has no layer " << layer.ToString();
      }
    }
    return x;
  }
};

// The loop written from the documented rules (jobs.proto JobSpec, docs/JOBS.md), with SGD.
Reference ReferenceLoop(const TrainingRun& run) {
  const JobSpec& spec = run.spec;
  const uint64_t seed = *spec.seed;
  const torch::Tensor& x_all = run.dataset->features;
  const torch::Tensor& y_all = run.dataset->targets;
  const int64_t rows = x_all.size(0);
  ReferenceModel model(run.model, x_all.size(1), seed);
  std::vector<torch::Tensor> params = model.parameters();
  torch::optim::SGD optimizer(params,
                              torch::optim::SGDOptions(spec.learning_rate).momentum(spec.momentum));
  const bool classes = spec.loss == LossKind::kCrossEntropy;
  auto loss_of = [&](const torch::Tensor& out, const torch::Tensor& y) {
    return classes ? torch::nn::functional::cross_entropy(out, y)
                   : torch::mse_loss(out, y.view(out.sizes()));
  };
  // The split: the last k of torch.randperm(rows, generator=Generator().manual_seed(seed)), k the
  // fraction of the rows rounded half away from zero; with shuffle=False both parts sorted.
  torch::Tensor train = torch::arange(rows, torch::kLong);
  torch::Tensor val;
  if (spec.validation_fraction > 0) {
    at::Generator split_gen = at::detail::createCPUGenerator(seed);
    const torch::Tensor perm = torch::randperm(rows, split_gen, torch::kLong);
    const int64_t k = std::llround(spec.validation_fraction * static_cast<double>(rows));
    train = perm.narrow(0, 0, rows - k);
    val = perm.narrow(0, rows - k, k);
    if (!spec.shuffle) {
      train = std::get<0>(train.sort());
      val = std::get<0>(val.sort());
    }
  }
  const int64_t n = train.size(0);
  const int64_t batch = std::min(spec.batch_size, n);
  const int64_t used = spec.drop_last ? n / batch * batch : n;
  const int32_t accumulate = spec.gradient_accumulation_steps;
  at::Generator gen = at::detail::createCPUGenerator(seed);
  Reference ref;
  for (int32_t epoch = 1; epoch <= spec.epochs; ++epoch) {
    torch::Tensor order = train;
    if (spec.shuffle) order = train.index_select(0, torch::randperm(n, gen, torch::kLong));
    double sum = 0;
    for (int64_t begin = 0, i = 0; begin < used; begin += batch, ++i) {
      const int64_t len = std::min(batch, used - begin);
      const torch::Tensor idx = order.narrow(0, begin, len);
      const torch::Tensor x = x_all.index_select(0, idx);
      const torch::Tensor y = y_all.index_select(0, idx);
      if (i % accumulate == 0) optimizer.zero_grad();
      const torch::Tensor loss = loss_of(model.forward(x, /*training=*/true, gen), y);
      (loss / static_cast<double>(accumulate)).backward();
      if ((i + 1) % accumulate == 0 || begin + batch >= used) {
        if (spec.clip_grad_norm > 0) torch::nn::utils::clip_grad_norm_(params, spec.clip_grad_norm);
        optimizer.step();
        ++ref.steps;
      }
      sum += static_cast<double>(loss.item<float>()) * static_cast<double>(len);
    }
    ref.losses.push_back(sum / static_cast<double>(used));
    if (val.defined()) {
      torch::NoGradGuard no_grad;
      const int64_t v = val.size(0);
      const int64_t vb = std::min(spec.batch_size, v);
      double val_sum = 0;
      int64_t correct = 0;
      for (int64_t begin = 0; begin < v; begin += vb) {
        const int64_t len = std::min(vb, v - begin);
        const torch::Tensor idx = val.narrow(0, begin, len);
        const torch::Tensor out = model.forward(x_all.index_select(0, idx), false, gen);
        const torch::Tensor y = y_all.index_select(0, idx);
        val_sum += static_cast<double>(loss_of(out, y).item<float>()) * static_cast<double>(len);
        if (classes) correct += out.argmax(1).eq(y).sum().item<int64_t>();
      }
      ref.validation_losses.push_back(val_sum / static_cast<double>(v));
      ref.validation_accuracies.push_back(static_cast<double>(correct) / static_cast<double>(v));
    }
  }
  for (const torch::Tensor& p : params) ref.parameters.push_back(p.detach().clone());
  return ref;
}

// The job's losses and parameters are the reference's (float32 arithmetic in the same order: the
// same to rounding).
void ExpectMatches(const Recorded& job, const Reference& ref) {
  ASSERT_EQ(job.outcome.state, JobState::kSucceeded) << job.outcome.error;
  ASSERT_EQ(job.epochs.size(), ref.losses.size());
  for (size_t e = 0; e < ref.losses.size(); ++e) {
    EXPECT_NEAR(job.epochs[e].loss, ref.losses[e], 1e-6 * std::fabs(ref.losses[e]))
        << "epoch " << e + 1;
    if (!ref.validation_losses.empty()) {
      ASSERT_TRUE(job.epochs[e].validation_loss.has_value());
      EXPECT_NEAR(*job.epochs[e].validation_loss, ref.validation_losses[e],
                  1e-6 * std::fabs(ref.validation_losses[e]))
          << "epoch " << e + 1;
    }
  }
  EXPECT_EQ(job.outcome.steps, ref.steps);
  ASSERT_EQ(job.outcome.parameters.size(), ref.parameters.size());
  for (size_t p = 0; p < ref.parameters.size(); ++p) {
    const torch::Tensor got = torch::tensor(job.outcome.parameters[p].values);
    const torch::Tensor want = ref.parameters[p].reshape({-1});
    EXPECT_TRUE(torch::allclose(got, want, /*rtol=*/1e-5, /*atol=*/1e-6))
        << job.outcome.parameters[p].name << ": " << got << " vs " << want;
  }
}

TEST(LoopSemanticsTest, TheReferenceLoopIsTheJobsLoop) {
  TrainingRun run = MakeRun(MakeDataset(60), "linear:8,relu,linear:1");
  run.spec.validation_fraction = 0.25;
  ExpectMatches(Train(run), ReferenceLoop(run));
}

// --no-shuffle takes the training rows in ascending row index, and the validation rows too; the
// held-out set is the one the shuffled job holds out.
TEST(LoopSemanticsTest, NoShuffleWithValidationTrainsTheSplitsRowsInDatasetOrder) {
  TrainingRun run = MakeRun(MakeDataset(50), "linear:8,relu,linear:1");
  run.spec.validation_fraction = 0.2;
  run.spec.shuffle = false;
  const Recorded job = Train(run);
  ExpectMatches(job, ReferenceLoop(run));
  EXPECT_EQ(job.outcome.steps, 4 * 6);  // 40 rows in batches of 7: 6 an epoch
  // Each epoch is the same pass: without shuffling nothing is drawn, and a second job repeats it.
  EXPECT_EQ(Train(run).epochs.back().loss, job.epochs.back().loss);
}

TEST(LoopSemanticsTest, HeldOutRowsRoundHalvesAwayFromZero) {
  EXPECT_EQ(HeldOutRows(0.25, 10), 3);    // 2.5: Python's round() would give 2
  EXPECT_EQ(HeldOutRows(0.125, 4), 1);    // 0.5
  EXPECT_EQ(HeldOutRows(0.375, 4), 2);    // 1.5
  EXPECT_EQ(HeldOutRows(0.25, 2), 1);     // 0.5
  EXPECT_EQ(HeldOutRows(0.29, 100), 29);  // 28.999... rounds up
  EXPECT_EQ(HeldOutRows(0.24, 10), 2);
  // The job holds out 3 of 10 at 0.25: 7 rows train.
  TrainingRun run = MakeRun(MakeDataset(10), "linear:1");
  run.spec.validation_fraction = 0.25;
  run.spec.batch_size = 7;
  run.spec.epochs = 1;
  const Recorded job = Train(run);
  ASSERT_EQ(job.outcome.state, JobState::kSucceeded) << job.outcome.error;
  EXPECT_EQ(job.outcome.steps, 1);
  ExpectMatches(job, ReferenceLoop(run));
}

// The documented draw order reproduces a dropout job bit for bit: per epoch the shuffle's
// randperm, then per batch each dropout layer's bernoulli_ mask, all from one CPU generator seeded
// with the job's seed.
TEST(LoopSemanticsTest, DropoutMasksFollowTheDocumentedDrawOrder) {
  TrainingRun run = MakeRun(MakeDataset(45),
                            "linear:16,relu,dropout:0.3,linear:8,relu,"
                            "dropout:0.5,linear:1");
  run.spec.validation_fraction = 0.2;
  run.spec.epochs = 5;
  const Recorded job = Train(run);
  ExpectMatches(job, ReferenceLoop(run));
  // The masks matter: the same job without dropout trains otherwise.
  TrainingRun plain = MakeRun(MakeDataset(45), "linear:16,relu,linear:8,relu,linear:1");
  plain.spec.validation_fraction = 0.2;
  plain.spec.epochs = 5;
  EXPECT_NE(Train(plain).epochs.back().loss, job.epochs.back().loss);
}

// Gradient accumulation as `(loss / N).backward()` per batch and a step after every N-th batch
// and the epoch's last: 32 rows in batches of 7 are 5 batches, 2 steps an epoch with N = 3 (the
// last group of 2 batches divided by 3 too), clipping on the accumulated gradients.
TEST(LoopSemanticsTest, GradientAccumulationIsTheUsualPyTorchLoop) {
  for (int32_t n : {2, 3, 5}) {
    SCOPED_TRACE(absl::StrCat("N = ", n));
    TrainingRun run = MakeRun(MakeDataset(32), "linear:8,relu,linear:1");
    run.spec.gradient_accumulation_steps = n;
    run.spec.clip_grad_norm = 0.3;
    const Recorded job = Train(run);
    const Reference ref = ReferenceLoop(run);
    ExpectMatches(job, ref);
    EXPECT_EQ(job.outcome.steps, 4 * ((5 + n - 1) / n));  // optimizer steps
  }
  // N = 1 is the plain loop, and N = 2 trains otherwise.
  TrainingRun one = MakeRun(MakeDataset(32), "linear:8,relu,linear:1");
  TrainingRun two = one;
  two.spec.gradient_accumulation_steps = 2;
  EXPECT_NE(Train(one).epochs.back().loss, Train(two).epochs.back().loss);
}

TEST(LoopSemanticsTest, GradientAccumulationWithDropoutAndValidation) {
  TrainingRun run = MakeRun(MakeDataset(40, /*classes=*/3), "linear:12,relu,dropout:0.25,linear:3");
  run.spec.gradient_accumulation_steps = 2;
  run.spec.validation_fraction = 0.25;
  ExpectMatches(Train(run), ReferenceLoop(run));
}

// fp16 with accumulation: one unscale, overflow check and step per group, so an epoch of 5
// batches in groups of 2 has 3 steps that may be skipped, and the job's steps count them.
TEST(LoopSemanticsTest, GradientAccumulationUnderFp16StepsOncePerGroup) {
  TrainingRun run = MakeRun(MakeDataset(32), "linear:8,relu,linear:1");
  run.spec.gradient_accumulation_steps = 2;
  run.spec.precision = Precision::kFp16;
  const Recorded job = Train(run);
  ASSERT_EQ(job.outcome.state, JobState::kSucceeded) << job.outcome.error;
  EXPECT_EQ(job.outcome.steps, 4 * 3);  // 5 batches: groups of 2, 2 and 1
  int64_t skipped = 0;
  for (const EpochResult& epoch : job.epochs) {
    ASSERT_TRUE(epoch.loss_scale.has_value());
    EXPECT_GE(epoch.skipped_steps, 0);
    EXPECT_LE(epoch.skipped_steps, 3);
    skipped += epoch.skipped_steps;
    // GradScaler's scale: halved once per skipped step, never grown within 2,000 clean ones.
    EXPECT_EQ(*epoch.loss_scale, std::ldexp(65536.0, -static_cast<int>(skipped)));
    EXPECT_TRUE(std::isfinite(epoch.loss));
  }
}

// drop_last: 32 rows in batches of 7 train 4 whole batches (28 rows) an epoch, and the epoch loss
// is their mean.
TEST(LoopSemanticsTest, DropLastDropsTheShortLastBatch) {
  TrainingRun run = MakeRun(MakeDataset(32), "linear:8,relu,linear:1");
  run.spec.drop_last = true;
  const Recorded job = Train(run);
  ExpectMatches(job, ReferenceLoop(run));
  EXPECT_EQ(job.outcome.steps, 4 * 4);
  // With accumulation the last group is the last whole batch's.
  run.spec.gradient_accumulation_steps = 3;
  const Recorded grouped = Train(run);
  ExpectMatches(grouped, ReferenceLoop(run));
  EXPECT_EQ(grouped.outcome.steps, 4 * 2);
}

// The fused path drops the same rows: its losses are the LibTorch path's to float rounding.
TEST(LoopSemanticsTest, DropLastOnTheFusedPath) {
  TrainingRun run = MakeRun(MakeDataset(32), "linear:8,relu,linear:1");
  run.spec.drop_last = true;
  TrainingRun fused = run;
  fused.spec.engine = EngineKind::kFused;
  const Recorded job = Train(fused);
  ASSERT_EQ(job.outcome.state, JobState::kSucceeded) << job.outcome.error;
  EXPECT_EQ(job.outcome.engine, "fused");
  EXPECT_EQ(job.outcome.steps, 4 * 4);
  const Reference ref = ReferenceLoop(run);
  ASSERT_EQ(job.epochs.size(), ref.losses.size());
  for (size_t e = 0; e < ref.losses.size(); ++e) {
    // The fused path's own arithmetic (fused_path_test's tolerance).
    EXPECT_NEAR(job.epochs[e].loss, ref.losses[e], 2e-4 * ref.losses[e]);
  }
}

TEST(LoopSemanticsTest, GradientAccumulationIsRefusedByTheFusedPathAndTakesLibTorchOnAuto) {
  TrainingRun run = MakeRun(MakeDataset(32), "linear:8,relu,linear:1");
  run.spec.gradient_accumulation_steps = 2;
  run.spec.engine = EngineKind::kFused;
  const Recorded refused = Train(run);
  EXPECT_EQ(refused.outcome.state, JobState::kFailed);
  EXPECT_EQ(refused.outcome.error,
            "engine fused cannot run this job: gradient accumulation runs on LibTorch's autograd "
            "(the fused step updates per batch)");
  run.spec.engine = EngineKind::kAuto;
  const Recorded job = Train(run);
  ASSERT_EQ(job.outcome.state, JobState::kSucceeded) << job.outcome.error;
  EXPECT_EQ(job.outcome.engine, "libtorch");
  EXPECT_THAT(job.outcome.engine_reason, HasSubstr("gradient accumulation"));
  ExpectMatches(job, ReferenceLoop(run));
}

// A pack of sweep members with drop_last or accumulation: each member is the job alone.
TEST(LoopSemanticsTest, PackedMembersDropAndAccumulateAsAlone) {
  for (const bool accumulate : {false, true}) {
    SCOPED_TRACE(accumulate ? "accumulation" : "drop_last");
    TrainingRun a = MakeRun(MakeDataset(32), "linear:8,relu,linear:1");
    a.spec.drop_last = true;
    if (accumulate) a.spec.gradient_accumulation_steps = 2;
    a.stack_on_cpu = true;
    TrainingRun b = a;
    b.spec.learning_rate = 0.02;
    b.spec.seed = 77;
    ASSERT_EQ(PackUnsupported(a, b), "");
    std::vector<Recorded> packed(2);
    a.on_epoch = [&](const EpochResult& e, int64_t, int64_t) { packed[0].epochs.push_back(e); };
    b.on_epoch = [&](const EpochResult& e, int64_t, int64_t) { packed[1].epochs.push_back(e); };
    RunPackedTraining({&a, &b},
                      [&](size_t i, TrainingOutcome o) { packed[i].outcome = std::move(o); });
    for (size_t i = 0; i < 2; ++i) {
      TrainingRun alone = i == 0 ? a : b;
      alone.on_epoch = nullptr;
      const Reference ref = ReferenceLoop(alone);
      ASSERT_EQ(packed[i].epochs.size(), ref.losses.size());
      for (size_t e = 0; e < ref.losses.size(); ++e) {
        // The stacked path's batched products round otherwise than the job alone's
        // (kStackedNumerics); with accumulation the members run in turn, each the job alone.
        EXPECT_NEAR(packed[i].epochs[e].loss, ref.losses[e],
                    (accumulate ? 1e-6 : 1e-4) * ref.losses[e]);
      }
      EXPECT_EQ(packed[i].outcome.steps, ref.steps);
    }
  }
  TrainingRun a = MakeRun(MakeDataset(32), "linear:8,relu,linear:1");
  TrainingRun b = a;
  b.spec.drop_last = true;
  EXPECT_NE(PackUnsupported(a, b), "");
  b = a;
  b.spec.gradient_accumulation_steps = 2;
  EXPECT_NE(PackUnsupported(a, b), "");
  b = a;
  b.spec.early_stop_min_delta = 0.1;
  EXPECT_NE(PackUnsupported(a, b), "");
  b = a;
  b.spec.early_stop_metric = EarlyStopMetric::kValidationAccuracy;
  EXPECT_NE(PackUnsupported(a, b), "");
}

// Keras' rule from the reported values: an epoch improves when it beats the best by more than
// min_delta (below for the loss, above for the accuracy); the best moves only then; the job stops
// after `patience` epochs in a row without one. Returns the epochs the job runs.
size_t EpochsUntilStop(const std::vector<double>& values, bool higher_is_better, double min_delta,
                       int patience) {
  double best = higher_is_better ? -std::numeric_limits<double>::infinity()
                                 : std::numeric_limits<double>::infinity();
  int wait = 0;
  for (size_t e = 0; e < values.size(); ++e) {
    const bool improved =
        higher_is_better ? values[e] - min_delta > best : values[e] + min_delta < best;
    if (improved) {
      best = values[e];
      wait = 0;
    } else if (++wait >= patience) {
      return e + 1;
    }
  }
  return values.size();
}

TEST(LoopSemanticsTest, EarlyStoppingMinDeltaFollowsKeras) {
  TrainingRun run = MakeRun(MakeDataset(80), "linear:8,relu,linear:1");
  run.spec.validation_fraction = 0.25;
  run.spec.learning_rate = 0.02;
  run.spec.epochs = 30;
  const Recorded full = Train(run);
  ASSERT_EQ(full.outcome.state, JobState::kSucceeded) << full.outcome.error;
  std::vector<double> val;
  for (const EpochResult& e : full.epochs) val.push_back(*e.validation_loss);
  // A min_delta that the validation loss's later improvements do not clear: chosen from the
  // reported values so that it stops the job where a zero min_delta would not.
  bool found = false;
  for (double min_delta : {1e-4, 3e-4, 1e-3, 3e-3, 1e-2}) {
    const size_t with = EpochsUntilStop(val, false, min_delta, 2);
    const size_t without = EpochsUntilStop(val, false, 0.0, 2);
    if (with == without || with == val.size()) continue;
    found = true;
    SCOPED_TRACE(absl::StrCat("min_delta ", min_delta));
    TrainingRun stopping = run;
    stopping.spec.early_stop_patience = 2;
    stopping.spec.early_stop_min_delta = min_delta;
    const Recorded job = Train(stopping);
    ASSERT_EQ(job.outcome.state, JobState::kSucceeded) << job.outcome.error;
    EXPECT_TRUE(job.outcome.stopped_early);
    ASSERT_EQ(job.epochs.size(), with);
    for (size_t e = 0; e < with; ++e) EXPECT_EQ(job.epochs[e].loss, full.epochs[e].loss);
    break;
  }
  EXPECT_TRUE(found) << "no min_delta tells the rules apart on this job";
  // A min_delta no change clears: the first epoch improves on +inf, the next `patience` do not.
  TrainingRun never = run;
  never.spec.early_stop_patience = 3;
  never.spec.early_stop_min_delta = 1e6;
  const Recorded job = Train(never);
  EXPECT_TRUE(job.outcome.stopped_early);
  EXPECT_EQ(job.epochs.size(), 4u);
}

TEST(LoopSemanticsTest, EarlyStoppingOnValidationAccuracy) {
  TrainingRun run = MakeRun(MakeDataset(120, /*classes=*/3), "linear:3");
  run.spec.validation_fraction = 0.25;
  run.spec.learning_rate = 0.01;
  run.spec.momentum = 0.0;
  run.spec.epochs = 25;
  const Recorded full = Train(run);
  ASSERT_EQ(full.outcome.state, JobState::kSucceeded) << full.outcome.error;
  std::vector<double> accuracy;
  for (const EpochResult& e : full.epochs) accuracy.push_back(*e.validation_accuracy);
  for (double min_delta : {0.0, 0.02}) {
    SCOPED_TRACE(absl::StrCat("min_delta ", min_delta));
    const size_t want = EpochsUntilStop(accuracy, true, min_delta, 3);
    TrainingRun stopping = run;
    stopping.spec.early_stop_patience = 3;
    stopping.spec.early_stop_min_delta = min_delta;
    stopping.spec.early_stop_metric = EarlyStopMetric::kValidationAccuracy;
    const Recorded job = Train(stopping);
    ASSERT_EQ(job.outcome.state, JobState::kSucceeded) << job.outcome.error;
    EXPECT_EQ(job.epochs.size(), want);
    EXPECT_EQ(job.outcome.stopped_early, want < accuracy.size());
  }
}

// The best accuracy and the epochs since are in the checkpoint: a job taken up from epoch 3 stops
// where the whole job stops.
TEST(LoopSemanticsTest, EarlyStoppingOnAccuracyResumesExactly) {
  const test_support::ScratchDir dir;
  TrainingRun run = MakeRun(MakeDataset(120, /*classes=*/3), "linear:3");
  run.spec.validation_fraction = 0.25;
  run.spec.learning_rate = 0.01;
  run.spec.momentum = 0.0;
  run.spec.epochs = 25;
  run.spec.early_stop_patience = 3;
  run.spec.early_stop_min_delta = 0.01;
  run.spec.early_stop_metric = EarlyStopMetric::kValidationAccuracy;
  run.spec.checkpoint_every = 1;
  run.checkpoint_dir = dir.path();
  const Recorded whole = Train(run);
  ASSERT_EQ(whole.outcome.state, JobState::kSucceeded) << whole.outcome.error;
  ASSERT_GT(whole.epochs.size(), 3u);
  TrainingRun resumed = run;
  resumed.checkpoint_dir.clear();
  resumed.resume_from = dir.path() + "/" + CheckpointFileName(3);
  const Recorded after = Train(resumed);
  ASSERT_EQ(after.outcome.state, JobState::kSucceeded) << after.outcome.error;
  ASSERT_EQ(after.epochs.size() + 3, whole.epochs.size());
  for (size_t e = 0; e < after.epochs.size(); ++e) {
    EXPECT_EQ(after.epochs[e].loss, whole.epochs[e + 3].loss);
    EXPECT_EQ(after.epochs[e].validation_accuracy, whole.epochs[e + 3].validation_accuracy);
  }
  EXPECT_EQ(after.outcome.stopped_early, whole.outcome.stopped_early);
}

// Submit's checks: each option's range, and the options that need another.
TEST(LoopSemanticsTest, CheckJobSpecRefusesWhatCannotWork) {
  DatasetMeta meta;
  meta.name = "loop";
  meta.rows = 40;
  meta.feature_shape = {5};
  meta.target_shape = {1};
  TrainingRun run = MakeRun(MakeDataset(40), "linear:1");
  JobSpec spec = run.spec;
  spec.validation_fraction = 0.25;
  auto error = [&](const JobSpec& s) {
    return std::string(CheckJobSpec(s, meta).status().message());
  };
  ASSERT_TRUE(CheckJobSpec(spec, meta).ok());

  JobSpec bad = spec;
  bad.gradient_accumulation_steps = 0;
  EXPECT_EQ(error(bad),
            "gradient accumulation steps must be at least 1 (1: a step per batch); got 0");
  bad = spec;
  bad.drop_last = true;
  bad.batch_size = 31;  // 30 rows train
  EXPECT_EQ(
      error(bad),
      "drop_last with batch size 31 would drop every row: dataset 'loop' has 30 rows to train "
      "on; use a batch size of at most 30 or keep the last batch");
  bad.batch_size = 30;
  EXPECT_TRUE(CheckJobSpec(bad, meta).ok());
  bad.replicas = 2;
  EXPECT_THAT(error(bad),
              HasSubstr("drop_last with batch size 30 on 2 ranks would drop every row"));
  bad = spec;
  bad.early_stop_min_delta = 0.1;
  EXPECT_EQ(
      error(bad),
      "early stop min_delta (0.1) applies to early stopping; give early_stop_patience N (>= 1) "
      "too");
  bad.early_stop_patience = 2;
  EXPECT_TRUE(CheckJobSpec(bad, meta).ok());
  bad.early_stop_min_delta = -0.1;
  EXPECT_EQ(error(bad),
            "early stop min_delta must be a finite number >= 0 (0: any improvement); got -0.1");
  bad.early_stop_min_delta = std::numeric_limits<double>::quiet_NaN();
  EXPECT_THAT(error(bad), HasSubstr("early stop min_delta must be a finite number >= 0"));
  bad.early_stop_min_delta = std::numeric_limits<double>::infinity();
  EXPECT_THAT(error(bad), HasSubstr("early stop min_delta must be a finite number >= 0"));
  bad = spec;
  bad.early_stop_metric = EarlyStopMetric::kValidationAccuracy;
  EXPECT_EQ(error(bad),
            "early stop metric accuracy applies to early stopping and halving; give "
            "early_stop_patience N (>= 1) or a sweep's halving too");
  bad.early_stop_patience = 2;
  EXPECT_EQ(error(bad),
            "early stop metric accuracy needs a class loss (cross_entropy or nll), not mse; watch "
            "the validation loss instead");
}

}  // namespace
}  // namespace trainerd::engine

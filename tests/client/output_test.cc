// Tests for client/output.h: tables, detail views, watch lines, number formats and JSON.
#include "client/output.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"

namespace trainerd::client {
namespace {

using ::google::protobuf::util::MessageDifferencer;
using ::testing::ContainsRegex;
using ::testing::EndsWith;
using ::testing::HasSubstr;
using ::testing::MatchesRegex;
using ::testing::Not;
using ::testing::StartsWith;

// A finished job of a small model, every field the views show set to a distinct value.
v1::Job SucceededJob() {
  v1::Job job;
  job.set_id("job-0123456789ab");
  job.set_state(v1::JOB_STATE_SUCCEEDED);
  v1::JobSpec* spec = job.mutable_spec();
  spec->set_dataset("iris");
  spec->set_model("linear:2");
  spec->set_loss(v1::LOSS_MSE);
  spec->mutable_optimizer()->set_kind(v1::OPTIMIZER_KIND_SGD);
  spec->mutable_optimizer()->set_learning_rate(0.01);
  spec->mutable_optimizer()->set_momentum(0.9);
  spec->set_batch_size(32);
  spec->set_epochs(3);
  spec->set_shuffle(true);
  spec->set_seed(7);
  const double losses[] = {0.5, 0.25, 0.012345};
  for (int i = 0; i < 3; ++i) {
    v1::EpochResult* epoch = job.add_epochs();
    epoch->set_epoch(i + 1);
    epoch->set_loss(losses[i]);
    epoch->set_elapsed_seconds(0.4 * (i + 1));
  }
  job.set_final_loss(0.012345);
  job.set_wall_seconds(1.234);
  job.set_steps(15);
  job.set_samples_per_second(364.7);
  job.set_device("cuda:0");
  job.set_host_syncs(5);
  job.set_parameter_count(4);
  v1::Parameter* weight = job.add_parameters();
  weight->set_name("0.weight");
  weight->add_shape(2);
  weight->add_shape(1);
  weight->add_values(0.5f);
  weight->add_values(-1.25f);
  v1::Parameter* bias = job.add_parameters();
  bias->set_name("0.bias");
  bias->add_shape(2);
  bias->add_values(0.125f);
  bias->add_values(2.0f);
  return job;
}

v1::Dataset IrisDataset() {
  v1::Dataset dataset;
  dataset.set_name("iris");
  dataset.add_feature_shape(4);
  dataset.set_target_dtype(v1::DTYPE_INT64);
  dataset.set_row_count(150);
  dataset.set_size_bytes(3600);
  dataset.set_sha256(std::string(64, 'a'));
  dataset.set_device("cuda:0");
  dataset.set_target_min(0);
  dataset.set_target_max(2);
  return dataset;
}

// ---- Job detail view -----------------------------------------------------------------------

TEST(JobDetailsTest, SucceededJobShowsEveryFieldAligned) {
  EXPECT_EQ(JobDetails(SucceededJob()),
            "id:          job-0123456789ab\n"
            "state:       SUCCEEDED\n"
            "dataset:     iris\n"
            "model:       linear:2 (4 parameters)\n"
            "loss:        mse\n"
            "optimizer:   sgd, lr 0.01, momentum 0.9\n"
            "batch size:  32\n"
            "shuffle:     yes\n"
            "seed:        7\n"
            "device:      cuda:0\n"
            "epochs:      3/3\n"
            "final loss:  0.012345\n"
            "wall time:   1.23 s\n"
            "steps:       15\n"
            "samples/s:   364.7\n"
            "host syncs:  5\n"
            "created:     -\n"
            "started:     -\n"
            "ended:       -\n"
            "parameters:\n"
            "  0.weight [2x1]: 0.5, -1.25\n"
            "  0.bias [2]: 0.125, 2\n");
}

TEST(JobDetailsTest, FailedJobShowsErrorAfterState) {
  v1::Job job = SucceededJob();
  job.set_state(v1::JOB_STATE_FAILED);
  job.set_error("loss became NaN at epoch 3");
  EXPECT_THAT(JobDetails(job), StartsWith("id:          job-0123456789ab\n"
                                          "state:       FAILED\n"
                                          "error:       loss became NaN at epoch 3\n"
                                          "dataset:     iris\n"));
}

TEST(JobDetailsTest, SucceededJobHasNoErrorLine) {
  EXPECT_THAT(JobDetails(SucceededJob()), Not(HasSubstr("error:")));
}

TEST(JobDetailsTest, QueuedJobShowsDashesForLossDeviceAndSeed) {
  v1::Job job;
  job.set_id("job-000000000001");
  job.set_state(v1::JOB_STATE_QUEUED);
  job.mutable_spec()->set_epochs(10);
  const std::string text = JobDetails(job);
  EXPECT_THAT(text, HasSubstr("\nepochs:      0/10\n"));
  EXPECT_THAT(text, HasSubstr("\nfinal loss:  -\n"));
  EXPECT_THAT(text, HasSubstr("\ndevice:      -\n"));
  EXPECT_THAT(text, HasSubstr("\nseed:        -\n"));
  EXPECT_THAT(text, EndsWith("\nparameters:  -\n"));
}

TEST(JobDetailsTest, DeviceFallsBackToSpecDevice) {
  v1::Job job = SucceededJob();
  job.clear_device();
  job.mutable_spec()->set_device("cpu");
  EXPECT_THAT(JobDetails(job), HasSubstr("\ndevice:      cpu\n"));
}

TEST(JobDetailsTest, ShuffleOffShowsNo) {
  v1::Job job = SucceededJob();
  job.mutable_spec()->set_shuffle(false);
  EXPECT_THAT(JobDetails(job), HasSubstr("\nshuffle:     no\n"));
}

TEST(JobDetailsTest, AdamOptimizerOmitsMomentum) {
  v1::Job job = SucceededJob();
  v1::Optimizer* optimizer = job.mutable_spec()->mutable_optimizer();
  optimizer->set_kind(v1::OPTIMIZER_KIND_ADAM);
  optimizer->set_learning_rate(0.001);
  optimizer->set_momentum(0);
  EXPECT_THAT(JobDetails(job), HasSubstr("\noptimizer:   adam, lr 0.001\n"));
}

TEST(JobDetailsTest, ScheduleAndClippingShowTheirSettingsAndTheLastRate) {
  v1::Job job = SucceededJob();
  v1::Optimizer* optimizer = job.mutable_spec()->mutable_optimizer();
  optimizer->set_kind(v1::OPTIMIZER_KIND_ADAMW);
  optimizer->set_momentum(0);
  optimizer->set_weight_decay(0.02);
  optimizer->set_beta1(0.8);
  v1::Schedule* schedule = job.mutable_spec()->mutable_schedule();
  schedule->set_kind(v1::Schedule::COSINE);
  schedule->set_min_learning_rate(0.001);
  schedule->set_warmup_epochs(1);
  job.mutable_spec()->set_clip_grad_norm(1);
  job.mutable_epochs(2)->set_learning_rate(0.0055);

  const std::string text = JobDetails(job);

  EXPECT_THAT(text, HasSubstr("\noptimizer:       adamw, lr 0.01, weight decay 0.02, beta1 0.8\n"
                              "schedule:        cosine towards 0.001, warm-up 1 epoch; lr 0.0055 in "
                              "epoch 3\n"
                              "clip grad norm:  1\n"
                              "batch size:      32\n"));
}

TEST(JobDetailsTest, StepScheduleShowsGammaAndPeriod) {
  v1::Job job = SucceededJob();
  job.mutable_spec()->mutable_schedule()->set_kind(v1::Schedule::STEP);
  job.mutable_spec()->mutable_schedule()->set_step_epochs(10);
  job.mutable_spec()->mutable_schedule()->set_gamma(0.5);
  job.clear_epochs();
  EXPECT_THAT(JobDetails(job), HasSubstr("\nschedule:    step, times 0.5 every 10 epochs\n"));
}

TEST(JobDetailsTest, PerStepSchedulesSayTheirUnitsAndOptions) {
  v1::Job job = SucceededJob();
  v1::Schedule* schedule = job.mutable_spec()->mutable_schedule();
  schedule->set_kind(v1::Schedule::MULTI_STEP);
  schedule->add_milestones(100);
  schedule->add_milestones(300);
  schedule->set_gamma(0.5);
  schedule->set_per_step(true);
  schedule->set_warmup_steps(20);
  job.clear_epochs();
  EXPECT_THAT(JobDetails(job),
              HasSubstr("\nschedule:    multistep, times 0.5 after steps 100, 300, per step, "
                        "warm-up 20 steps\n"));
  schedule->Clear();
  schedule->set_kind(v1::Schedule::ONE_CYCLE);
  EXPECT_THAT(JobDetails(job),
              HasSubstr("\nschedule:    onecycle, cos, pct_start 0.3, div_factor 25, "
                        "final_div_factor 10000, per step\n"));
  schedule->Clear();
  schedule->set_kind(v1::Schedule::REDUCE_ON_PLATEAU);
  schedule->set_patience(2);
  EXPECT_THAT(JobDetails(job),
              HasSubstr("\nschedule:    plateau, times 0.1 after 2 epochs without improvement "
                        "(threshold 0.0001), cooldown 0 epochs, min 0\n"));
}

TEST(JobDetailsTest, ConstantScheduleAndNoClippingAddNoLines) {
  const std::string text = JobDetails(SucceededJob());
  EXPECT_THAT(text, Not(HasSubstr("schedule:")));
  EXPECT_THAT(text, Not(HasSubstr("clip grad norm:")));
}

TEST(JobDetailsTest, LossShowsHuberDeltaAndLabelSmoothing) {
  v1::Job job = SucceededJob();
  job.mutable_spec()->set_loss(v1::LOSS_HUBER);
  job.mutable_spec()->set_huber_delta(0.5);
  EXPECT_THAT(JobDetails(job), HasSubstr("\nloss:        huber, delta 0.5\n"));
  job.mutable_spec()->set_loss(v1::LOSS_CROSS_ENTROPY);
  job.mutable_spec()->set_huber_delta(0);
  job.mutable_spec()->set_label_smoothing(0.1);
  EXPECT_THAT(JobDetails(job), HasSubstr("\nloss:        cross_entropy, label smoothing 0.1\n"));
}

TEST(JobDetailsTest, LossShowsClassWeightsIgnoreIndexAndPosWeight) {
  v1::Job job = SucceededJob();
  job.mutable_spec()->set_loss(v1::LOSS_CROSS_ENTROPY);
  for (double w : {0.5, 2.0, 1.25}) job.mutable_spec()->add_class_weights(w);
  job.mutable_spec()->set_ignore_index(-100);
  EXPECT_THAT(JobDetails(job), HasSubstr("\nloss:        cross_entropy, class weights 0.5,2,1.25, "
                                         "ignore index -100\n"));
  job.mutable_spec()->clear_class_weights();
  for (int i = 0; i < 10; ++i) job.mutable_spec()->add_class_weights(1 + i);
  EXPECT_THAT(JobDetails(job), HasSubstr("class weights 1,2,3,4,5,6,7,8,... (10 values)"));
  job.mutable_spec()->clear_class_weights();
  job.mutable_spec()->clear_ignore_index();
  job.mutable_spec()->set_loss(v1::LOSS_BCE_WITH_LOGITS);
  job.mutable_spec()->add_pos_weight(3);
  EXPECT_THAT(JobDetails(job), HasSubstr("\nloss:        bce_with_logits, pos_weight 3\n"));
}

TEST(JobDetailsTest, SgdShowsNesterovAfterMomentum) {
  v1::Job job = SucceededJob();
  job.mutable_spec()->mutable_optimizer()->set_nesterov(true);
  EXPECT_THAT(JobDetails(job), HasSubstr("\noptimizer:   sgd, lr 0.01, momentum 0.9 (nesterov)\n"));
}

TEST(JobDetailsTest, LongParameterIsCutAfterTenValues) {
  v1::Job job = SucceededJob();
  job.clear_parameters();
  v1::Parameter* weight = job.add_parameters();
  weight->set_name("0.weight");
  weight->add_shape(3);
  weight->add_shape(4);
  for (int i = 0; i < 12; ++i) weight->add_values(static_cast<float>(i));
  EXPECT_THAT(JobDetails(job),
              EndsWith("parameters:\n"
                       "  0.weight [3x4]: 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, ... (12 values; all with "
                       "-o json)\n"));
}

TEST(JobDetailsTest, LargeFinishedModelSaysParametersWereNotReported) {
  v1::Job job = SucceededJob();
  job.clear_parameters();
  job.set_parameter_count(5000);
  EXPECT_THAT(JobDetails(job), EndsWith("\nparameters:  not reported (more than 1,000 values)\n"));
}

// ---- Watch lines ---------------------------------------------------------------------------

v1::EpochResult Epoch(int32_t number, double loss) {
  v1::EpochResult epoch;
  epoch.set_epoch(number);
  epoch.set_loss(loss);
  return epoch;
}

TEST(EpochLineTest, ShowsEpochOfPlannedAndLoss) {
  EXPECT_EQ(EpochLine(Epoch(3, 0.25), 10), "epoch 3/10  loss 0.250000");
}

TEST(EpochLineTest, OmitsPlannedWhenUnknown) {
  EXPECT_EQ(EpochLine(Epoch(3, 0.25), 0), "epoch 3  loss 0.250000");
}

TEST(EpochLineTest, TinyLossUsesExponent) {
  EXPECT_EQ(EpochLine(Epoch(100, 1.5e-9), 100), "epoch 100/100  loss 1.500000e-09");
}

TEST(JobOutcomeLineTest, SucceededShowsWallTimeAndFinalLoss) {
  v1::Job job = SucceededJob();
  job.set_final_loss(0.009812);
  EXPECT_EQ(JobOutcomeLine(job), "job job-0123456789ab SUCCEEDED in 1.23 s, final loss 0.009812");
}

TEST(EpochLineTest, ShowsValidationLossAndAccuracyWhenPresent) {
  v1::EpochResult epoch = Epoch(3, 0.25);
  epoch.set_validation_loss(0.3125);
  epoch.set_validation_accuracy(0.9725);
  EXPECT_EQ(EpochLine(epoch, 10), "epoch 3/10  loss 0.250000  val_loss 0.312500  val_acc 97.25%");
}

TEST(EpochLineTest, ShowsValidationLossAloneForRegression) {
  v1::EpochResult epoch = Epoch(3, 0.25);
  epoch.set_validation_loss(0.5);
  EXPECT_EQ(EpochLine(epoch, 10), "epoch 3/10  loss 0.250000  val_loss 0.500000");
}

TEST(JobOutcomeLineTest, StoppedEarlySaysSoWithTheEpochsDone) {
  v1::Job job = SucceededJob();
  job.mutable_spec()->set_epochs(20);
  job.set_stopped_early(true);
  EXPECT_EQ(JobOutcomeLine(job),
            "job job-0123456789ab SUCCEEDED in 1.23 s, final loss 0.012345 (stopped early after "
            "3/20 epochs)");
}

TEST(JobOutcomeLineTest, AModelFromTheBestEpochSaysWhich) {
  v1::Job job = SucceededJob();
  job.mutable_spec()->set_epochs(20);
  job.set_stopped_early(true);
  job.set_best_epoch(1);
  job.set_model_epoch(1);
  EXPECT_EQ(JobOutcomeLine(job),
            "job job-0123456789ab SUCCEEDED in 1.23 s, final loss 0.012345 (stopped early after "
            "3/20 epochs), model from the best epoch (1)");
  job.set_model_epoch(3);  // model_from last
  EXPECT_EQ(JobOutcomeLine(job),
            "job job-0123456789ab SUCCEEDED in 1.23 s, final loss 0.012345 (stopped early after "
            "3/20 epochs)");
}

TEST(JobDetailsTest, TheBestEpochAndTheModelsEpochAreShown) {
  v1::Job job = SucceededJob();
  job.mutable_spec()->set_validation_fraction(0.2);
  job.mutable_spec()->set_early_stop_patience(2);
  job.mutable_epochs(1)->set_validation_loss(0.0625);
  job.mutable_epochs(1)->set_validation_accuracy(0.96);
  job.mutable_epochs(2)->set_validation_loss(0.125);
  job.set_best_epoch(2);
  job.set_model_epoch(2);
  EXPECT_THAT(JobDetails(job), HasSubstr("\nbest epoch:      epoch 2, val loss 0.062500, val "
                                         "accuracy 96.00%\n"
                                         "model from:      epoch 2 (the best)\n"));
  job.set_model_epoch(3);
  EXPECT_THAT(JobDetails(job), HasSubstr("\nmodel from:      epoch 3 (the last)\n"));
  EXPECT_THAT(JobDetails(SucceededJob()), Not(HasSubstr("model from")));
}

TEST(JobDetailsTest, CheckpointsShowTheIntervalAndOneLinePerFile) {
  v1::Job job = SucceededJob();
  job.mutable_spec()->set_checkpoint_every(2);
  v1::Checkpoint* checkpoint = job.add_checkpoints();
  checkpoint->set_epoch(2);
  checkpoint->set_path("checkpoints/job-0123456789ab/epoch-000002.pt");
  checkpoint->set_size_bytes(1234);

  const std::string text = JobDetails(job);

  EXPECT_THAT(text, HasSubstr("\ncheckpoints:  every 2 epochs, 1 written\n"));
  EXPECT_THAT(text, EndsWith("\ncheckpoint files:\n"
                             "  epoch 2  checkpoints/job-0123456789ab/epoch-000002.pt"
                             "  (1234 bytes)\n"));
}

TEST(JobDetailsTest, JobWithoutCheckpointsHasNoCheckpointLines) {
  EXPECT_THAT(JobDetails(SucceededJob()), Not(HasSubstr("checkpoint")));
}

TEST(JobDetailsTest, LoopOptionsAreShownWhenSet) {
  const std::string plain = JobDetails(SucceededJob());
  EXPECT_THAT(plain, Not(HasSubstr("accumulation")));
  EXPECT_THAT(plain, Not(HasSubstr("drop last")));
  v1::Job job = SucceededJob();
  job.mutable_spec()->set_gradient_accumulation_steps(4);
  job.mutable_spec()->set_drop_last(true);
  job.mutable_spec()->set_validation_fraction(0.2);
  job.mutable_spec()->set_early_stop_patience(3);
  job.mutable_spec()->set_early_stop_min_delta(0.01);
  job.mutable_spec()->set_early_stop_metric(v1::EARLY_STOP_METRIC_VALIDATION_ACCURACY);

  const std::string text = JobDetails(job);

  EXPECT_THAT(text, HasSubstr("\ndrop last:       yes (a short last batch is dropped)\n"
                              "accumulation:    4 batches per optimizer step\n"));
  EXPECT_THAT(text, HasSubstr("\nearly stopping:  3 epochs on val accuracy, min delta 0.01\n"));
}

TEST(JobDetailsTest, ValidationShowsItsSourceAndTheLastEpochsNumbers) {
  v1::Job job = SucceededJob();
  job.mutable_spec()->set_validation_fraction(0.2);
  job.mutable_spec()->set_early_stop_patience(5);
  job.set_stopped_early(true);
  job.mutable_epochs(2)->set_validation_loss(0.0625);
  job.mutable_epochs(2)->set_validation_accuracy(0.96);

  const std::string text = JobDetails(job);

  // With the rule that recovers the held-out rows.
  EXPECT_THAT(text, HasSubstr("\nvalidation:      20% of dataset 'iris' held out: the last "
                              "round(0.2 * rows) of torch.randperm(rows, "
                              "generator=torch.Generator().manual_seed(7)), halves rounded "
                              "away from zero\n"
                              "early stopping:  5 epochs (stopped early)\n"));
  EXPECT_THAT(text, HasSubstr("\nfinal loss:      0.012345\n"
                              "val loss:        0.062500\n"
                              "val accuracy:    96.00%\n"
                              "wall time:"));
}

TEST(JobDetailsTest, ValidationDatasetIsNamed) {
  v1::Job job = SucceededJob();
  job.mutable_spec()->set_validation_dataset("iris-test");
  EXPECT_THAT(JobDetails(job), HasSubstr("\nvalidation:  dataset 'iris-test'\n"));
}

TEST(JobDetailsTest, NoValidationAddsNoLines) {
  const std::string text = JobDetails(SucceededJob());
  EXPECT_THAT(text, Not(HasSubstr("validation")));
  EXPECT_THAT(text, Not(HasSubstr("val ")));
  EXPECT_THAT(text, Not(HasSubstr("early")));
}

TEST(JobOutcomeLineTest, FailedShowsTheError) {
  v1::Job job = SucceededJob();
  job.set_state(v1::JOB_STATE_FAILED);
  job.set_error("loss became NaN at epoch 3");
  EXPECT_EQ(JobOutcomeLine(job), "job job-0123456789ab FAILED: loss became NaN at epoch 3");
}

TEST(JobOutcomeLineTest, CancelledShowsEpochsDone) {
  v1::Job job = SucceededJob();
  job.set_state(v1::JOB_STATE_CANCELLED);
  job.mutable_spec()->set_epochs(10);
  EXPECT_EQ(JobOutcomeLine(job), "job job-0123456789ab CANCELLED after 3/10 epochs");
}

// ---- Tables --------------------------------------------------------------------------------

TEST(DatasetListTableTest, ColumnsAreAlignedWithoutTrailingSpaces) {
  v1::ListDatasetsResponse response;
  *response.add_datasets() = IrisDataset();
  v1::Dataset* sine = response.add_datasets();
  sine->set_name("sine");
  sine->add_feature_shape(1);
  sine->add_target_shape(1);
  sine->set_target_dtype(v1::DTYPE_FLOAT32);
  sine->set_row_count(1000);
  sine->set_size_bytes(8000);
  EXPECT_EQ(DatasetListTable(response),
            "NAME  ROWS  FEATURES  TARGETS       SIZE     DEVICE  CREATED\n"
            "iris  150   4         scalar int64  3.5 KiB  cuda:0  -\n"
            "sine  1000  1         1 float32     7.8 KiB  -       -\n");
}

TEST(DatasetListTableTest, EmptyListIsTheHeaderLine) {
  EXPECT_EQ(DatasetListTable(v1::ListDatasetsResponse()),
            "NAME  ROWS  FEATURES  TARGETS  SIZE  DEVICE  CREATED\n");
}

TEST(DatasetDetailsTest, Int64TargetsShowClassRangeAndExactSize) {
  const std::string sha256(64, 'a');
  EXPECT_EQ(DatasetDetails(IrisDataset()), absl::StrCat("name:      iris\n"
                                                        "rows:      150\n"
                                                        "features:  4 float32\n"
                                                        "targets:   scalar int64 (classes 0..2)\n"
                                                        "size:      3.5 KiB (3600 bytes)\n"
                                                        "sha256:    ",
                                                        sha256,
                                                        "\n"
                                                        "device:    cuda:0\n"
                                                        "created:   -\n"));
}

TEST(DatasetDetailsTest, SmallSizeIsShownInBytesOnce) {
  v1::Dataset dataset = IrisDataset();
  dataset.set_size_bytes(512);
  EXPECT_THAT(DatasetDetails(dataset), HasSubstr("\nsize:      512 B\n"));
}

// Another owner's dataset is shown by the name the daemon gives (OWNER/NAME), with its owner; a
// copy a leader made for its jobs says so.
TEST(DatasetDetailsTest, AnotherOwnersCopyForPeersSaysWhatItIs) {
  v1::Dataset dataset = IrisDataset();
  dataset.set_name("alice/iris");
  dataset.set_owner("alice");
  dataset.set_peer_copy(true);
  const std::string details = DatasetDetails(dataset);
  EXPECT_THAT(details, HasSubstr("name:       alice/iris\n"));
  EXPECT_THAT(details, HasSubstr("\nowner:      alice\n"));
  EXPECT_THAT(details, HasSubstr("\npeer copy:  yes: another daemon sent it for its jobs here"));
  EXPECT_THAT(DatasetDetails(IrisDataset()), ::testing::Not(HasSubstr("peer copy")));
}

TEST(JobListTableTest, RowShowsProgressLossAndShortenedModel) {
  v1::ListJobsResponse response;
  v1::Job* job = response.add_jobs();
  job->set_id("job-000000000001");
  job->set_state(v1::JOB_STATE_RUNNING);
  job->mutable_spec()->set_dataset("mnist");
  job->mutable_spec()->set_model(
      "linear:512,relu,linear:512,relu,linear:256,relu,linear:10");  // 57 characters
  job->mutable_spec()->set_epochs(10);
  job->add_epochs()->set_loss(0.5);
  job->set_final_loss(0.5);
  job->set_device("cuda:0");
  const std::string text = JobListTable(response);
  EXPECT_EQ(text,
            "ID                STATE    DATASET  MODEL                                     "
            "EPOCHS  LOSS      DEVICE  CREATED\n"
            "job-000000000001  RUNNING  mnist    linear:512,relu,linear:512,relu,linea...  "
            "1/10    0.500000  cuda:0  -\n");
}

TEST(DatasetListTableTest, WideAddsLastUseOwnerAndChecksumAndNoHeadersDropsTheHeaderLine) {
  v1::ListDatasetsResponse response;
  *response.add_datasets() = IrisDataset();
  response.mutable_datasets(0)->set_owner("alice");
  response.mutable_datasets(0)->mutable_last_use_time()->set_seconds(1765000000);
  const std::string last_used = absl::FormatTime(
      "%Y-%m-%d %H:%M:%S", absl::FromUnixSeconds(1765000000), absl::LocalTimeZone());
  const std::string sha256(64, 'a');
  EXPECT_EQ(DatasetListTable(response, {/*wide=*/true, /*headers=*/true}),
            absl::StrCat("NAME  ROWS  FEATURES  TARGETS       SIZE     DEVICE  CREATED  LAST USED"
                         "            OWNER  SHA256\n"
                         "iris  150   4         scalar int64  3.5 KiB  cuda:0  -        ",
                         last_used, "  alice  ", sha256, "\n"));
  // A dataset no job has taken since a daemon that kept no last use: a dash.
  response.mutable_datasets(0)->clear_last_use_time();
  EXPECT_THAT(DatasetListTable(response, {true, false}), HasSubstr("  -        -  "));
  // The columns keep the header's width: a script's columns line up with the table a person saw.
  EXPECT_EQ(DatasetListTable(response, {/*wide=*/false, /*headers=*/false}),
            "iris  150   4         scalar int64  3.5 KiB  cuda:0  -\n");
  EXPECT_EQ(DatasetListTable(v1::ListDatasetsResponse(), {false, false}), "");
}

TEST(JobListTableTest, WideShowsTheWholeModelTheTrainingSettingsEngineSweepAndOwner) {
  v1::ListJobsResponse response;
  v1::Job* job = response.add_jobs();
  *job = SucceededJob();
  job->mutable_spec()->set_model("linear:512,relu,linear:512,relu,linear:256,relu,linear:10");
  job->mutable_report()->set_engine("fused");
  job->set_sweep_id("sweep-0123456789ab");
  job->set_owner("ci");
  EXPECT_EQ(JobListTable(response, {/*wide=*/true, /*headers=*/false}),
            "job-0123456789ab  SUCCEEDED  iris     "
            "linear:512,relu,linear:512,relu,linear:256,relu,linear:10  3/3     0.012345  cuda:0  "
            "-        mse      sgd        0.01  fused   sweep-0123456789ab  ci\n");
  const std::string wide = JobListTable(response, {/*wide=*/true, /*headers=*/true});
  EXPECT_THAT(wide, StartsWith("ID                STATE      DATASET  MODEL"));
  EXPECT_THAT(wide, HasSubstr("CREATED  LOSS FN  OPTIMIZER  LR    ENGINE  SWEEP"));
}

TEST(DeviceListTableTest, WideSaysWhyAGpuIsUnusable) {
  v1::ListDevicesResponse response;
  v1::DeviceStatus* gpu = response.add_devices();
  gpu->set_device("cuda:1");
  gpu->set_name("NVIDIA H200");
  gpu->set_unusable_reason("LibTorch sees 1 CUDA device");
  EXPECT_EQ(DeviceListTable(response, {/*wide=*/true, /*headers=*/true}),
            "DEVICE             NAME         UTIL  MEMORY  DATASETS  RUNNING  QUEUED  "
            "UNUSABLE BECAUSE\n"
            "cuda:1 (unusable)  NVIDIA H200  -     -       -         -        0       "
            "LibTorch sees 1 CUDA device\n");
}

// ---- YAML ------------------------------------------------------------------------------------

TEST(YamlTest, DatasetIsBlockYamlInFieldOrderWithInt64AsQuotedStrings) {
  v1::Dataset dataset = IrisDataset();
  dataset.set_sha256("ab12");
  absl::StatusOr<std::string> yaml = ToYaml(dataset);
  ASSERT_TRUE(yaml.ok()) << yaml.status();
  EXPECT_EQ(*yaml,
            "name: iris\n"
            "feature_shape:\n"
            "  - \"4\"\n"
            "target_shape: []\n"
            "target_dtype: DTYPE_INT64\n"
            "row_count: \"150\"\n"
            "size_bytes: \"3600\"\n"
            "sha256: ab12\n"
            "device: cuda:0\n"
            "location: DATASET_LOCATION_UNSPECIFIED\n"
            "target_min: \"0\"\n"
            "target_max: \"2\"\n"
            "owner: \"\"\n"
            "shared: false\n"
            "peer_copy: false\n");
}

TEST(YamlTest, NestedMessagesListsNumbersAndBooleansKeepTheirJsonTypes) {
  absl::StatusOr<std::string> yaml = JsonToYaml(
      R"({"spec": {"lr": 0.01, "shuffle": true, "layers": ["linear:2", "relu"], "empty": {}},
          "losses": [0.5, 1e-09], "none": null})");
  ASSERT_TRUE(yaml.ok()) << yaml.status();
  EXPECT_EQ(*yaml,
            "spec:\n"
            "  lr: 0.01\n"
            "  shuffle: true\n"
            "  layers:\n"
            "    - linear:2\n"
            "    - relu\n"
            "  empty: {}\n"
            "losses:\n"
            "  - 0.5\n"
            "  - 1e-09\n"
            "none: ~\n");
}

TEST(YamlTest, StringsThatYamlWouldReadAsSomethingElseAreQuoted) {
  absl::StatusOr<std::string> yaml = JsonToYaml(
      R"(["true", "No", "null", "~", "", "13.0", "42", ".inf", "- x", "a: b", "x #y", "#c",
          " pad", "plain text", "cpu", "job-0123", "line\nbreak"])");
  ASSERT_TRUE(yaml.ok()) << yaml.status();
  EXPECT_EQ(*yaml,
            "- \"true\"\n- \"No\"\n- \"null\"\n- \"~\"\n- \"\"\n- \"13.0\"\n- \"42\"\n"
            "- \".inf\"\n- \"- x\"\n- \"a: b\"\n- \"x #y\"\n- \"#c\"\n- \" pad\"\n"
            "- plain text\n- cpu\n- job-0123\n- \"line\\nbreak\"\n");
}

TEST(YamlTest, TextThatIsNotJsonIsInvalidArgument) {
  EXPECT_EQ(JsonToYaml("{\"a\": [1, 2").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(JobDetailsTest, RestartsSayHowOftenAndFromWhere) {
  v1::Job job;
  job.set_id("job-000000000002");
  job.set_state(v1::JOB_STATE_RUNNING);
  job.mutable_spec()->set_epochs(10);
  job.set_epochs_completed(4);  // a basic view: the count without the epochs
  job.add_restarts()->set_from_epoch(0);
  v1::JobRestart* last = job.add_restarts();
  last->set_from_epoch(4);
  last->mutable_time()->set_seconds(1'700'000'000);
  const std::string text = JobDetails(job);
  EXPECT_THAT(text, HasSubstr("4/10"));
  EXPECT_THAT(
      text, ::testing::ContainsRegex("restarts: +2 \\(last .*, from the checkpoint of epoch 4\\)"));

  job.mutable_restarts()->RemoveLast();
  EXPECT_THAT(JobDetails(job),
              ::testing::ContainsRegex("restarts: +1 \\(last .*, from the start\\)"));
}

TEST(TextTableTest, ShortRowIsPaddedAndTrailingSpacesDropped) {
  TextTable table({"A", "LONGER", "C"});
  table.AddRow({"wide value", "x"});
  table.AddRow({"1", "2", "3"});
  EXPECT_EQ(table.Render(),
            "A           LONGER  C\n"
            "wide value  x\n"
            "1           2       3\n");
}

TEST(KeyValueLinesTest, ValuesAlignTwoSpacesAfterLongestKey) {
  EXPECT_EQ(KeyValueLines({{"a", "1"}, {"longer", "2"}}),
            "a:       1\n"
            "longer:  2\n");
}

// ---- Number and name formats ---------------------------------------------------------------

TEST(FormatLossTest, UsualRangeHasSixDecimals) {
  EXPECT_EQ(FormatLoss(0), "0.000000");
  EXPECT_EQ(FormatLoss(0.012345), "0.012345");
  EXPECT_EQ(FormatLoss(1234.5678), "1234.567800");
  EXPECT_EQ(FormatLoss(0.001), "0.001000");
}

TEST(FormatLossTest, TinyAndHugeLossesUseExponent) {
  EXPECT_EQ(FormatLoss(0.0005), "5.000000e-04");
  EXPECT_EQ(FormatLoss(1e6), "1.000000e+06");
}

TEST(FormatLossTest, NonFiniteLossesAreSpelledOut) {
  EXPECT_EQ(FormatLoss(std::numeric_limits<double>::quiet_NaN()), "NaN");
  EXPECT_EQ(FormatLoss(-std::numeric_limits<double>::quiet_NaN()), "NaN");
  EXPECT_EQ(FormatLoss(std::numeric_limits<double>::infinity()), "inf");
}

TEST(FormatBytesTest, PicksBinaryUnit) {
  EXPECT_EQ(FormatBytes(0), "0 B");
  EXPECT_EQ(FormatBytes(1023), "1023 B");
  EXPECT_EQ(FormatBytes(1024), "1.0 KiB");
  EXPECT_EQ(FormatBytes(3000), "2.9 KiB");
  EXPECT_EQ(FormatBytes(27 * 1024 * 1024), "27.0 MiB");
  EXPECT_EQ(FormatBytes(int64_t{5} << 30), "5.0 GiB");
  EXPECT_EQ(FormatBytes(int64_t{3} << 40), "3.0 TiB");
}

TEST(FormatTimestampTest, UnsetTimestampIsADash) {
  EXPECT_EQ(FormatTimestamp(google::protobuf::Timestamp()), "-");
}

TEST(FormatTimestampTest, SetTimestampIsDateAndTime) {
  google::protobuf::Timestamp timestamp;
  timestamp.set_seconds(1714566896);  // 2024-05-01 12:34:56 UTC
  EXPECT_THAT(FormatTimestamp(timestamp), MatchesRegex("2024-05-0[12] [0-9][0-9]:[0-9][0-9]:56"));
}

TEST(NamesTest, EnumsHaveTheirCommandLineNames) {
  EXPECT_EQ(JobStateName(v1::JOB_STATE_QUEUED), "QUEUED");
  EXPECT_EQ(JobStateName(v1::JOB_STATE_CANCELLED), "CANCELLED");
  EXPECT_EQ(JobStateName(v1::JOB_STATE_UNSPECIFIED), "UNKNOWN(0)");
  EXPECT_EQ(LossName(v1::LOSS_CROSS_ENTROPY), "cross_entropy");
  EXPECT_EQ(OptimizerName(v1::OPTIMIZER_KIND_ADAM), "adam");
  EXPECT_EQ(LossName(v1::LOSS_L1), "l1");
  EXPECT_EQ(LossName(v1::LOSS_HUBER), "huber");
  EXPECT_EQ(LossName(v1::LOSS_BCE_WITH_LOGITS), "bce_with_logits");
  EXPECT_EQ(LossName(v1::LOSS_NLL), "nll");
  EXPECT_EQ(OptimizerName(v1::OPTIMIZER_KIND_ADAMW), "adamw");
  EXPECT_EQ(OptimizerName(v1::OPTIMIZER_KIND_RMSPROP), "rmsprop");
  EXPECT_EQ(DTypeName(v1::DTYPE_INT64), "int64");
  EXPECT_EQ(DTypeName(v1::DTYPE_UNSPECIFIED), "unknown(0)");
}

TEST(NamesTest, OnlySucceededFailedAndCancelledAreTerminal) {
  EXPECT_FALSE(IsTerminal(v1::JOB_STATE_UNSPECIFIED));
  EXPECT_FALSE(IsTerminal(v1::JOB_STATE_QUEUED));
  EXPECT_FALSE(IsTerminal(v1::JOB_STATE_RUNNING));
  EXPECT_TRUE(IsTerminal(v1::JOB_STATE_SUCCEEDED));
  EXPECT_TRUE(IsTerminal(v1::JOB_STATE_FAILED));
  EXPECT_TRUE(IsTerminal(v1::JOB_STATE_CANCELLED));
}

// ---- JSON ----------------------------------------------------------------------------------

TEST(ToJsonTest, JobUsesProtoFieldNames) {
  const absl::StatusOr<std::string> json = ToJson(SucceededJob(), /*pretty=*/true);
  ASSERT_TRUE(json.ok()) << json.status();
  EXPECT_THAT(*json, HasSubstr("\"host_syncs\": \"5\""));
  EXPECT_THAT(*json, HasSubstr("\"final_loss\": 0.012345"));
  EXPECT_THAT(*json, HasSubstr("\"batch_size\": \"32\""));
  EXPECT_THAT(*json, HasSubstr("\"state\": \"JOB_STATE_SUCCEEDED\""));
  EXPECT_THAT(*json, Not(HasSubstr("hostSyncs")));
  EXPECT_THAT(*json, Not(HasSubstr("finalLoss")));
}

TEST(ToJsonTest, UnsetPrimitiveFieldsArePrinted) {
  const absl::StatusOr<std::string> json = ToJson(SucceededJob(), /*pretty=*/true);
  ASSERT_TRUE(json.ok()) << json.status();
  EXPECT_THAT(*json, HasSubstr("\"error\": \"\""));
  EXPECT_THAT(*json, HasSubstr("\"device\": \"\""));  // the spec's, left to the daemon
}

TEST(ToJsonTest, JobParsesBackToAnEqualMessage) {
  v1::Job job = SucceededJob();
  job.mutable_create_time()->set_seconds(1714566896);
  job.mutable_create_time()->set_nanos(500000000);
  job.mutable_parameters(0)->set_values(0, 0.1f);  // not exact in binary
  const absl::StatusOr<std::string> json = ToJson(job, /*pretty=*/true);
  ASSERT_TRUE(json.ok()) << json.status();

  v1::Job parsed;
  const auto status = google::protobuf::util::JsonStringToMessage(*json, &parsed);
  ASSERT_TRUE(status.ok()) << status.ToString();
  EXPECT_TRUE(MessageDifferencer::Equals(parsed, job)) << "parsed:\n"
                                                       << parsed.DebugString() << "original:\n"
                                                       << job.DebugString();
}

TEST(ToJsonTest, DatasetParsesBackToAnEqualMessage) {
  const absl::StatusOr<std::string> json = ToJson(IrisDataset(), /*pretty=*/true);
  ASSERT_TRUE(json.ok()) << json.status();
  EXPECT_THAT(*json, HasSubstr("\"row_count\": \"150\""));
  EXPECT_THAT(*json, HasSubstr("\"target_dtype\": \"DTYPE_INT64\""));

  v1::Dataset parsed;
  const auto status = google::protobuf::util::JsonStringToMessage(*json, &parsed);
  ASSERT_TRUE(status.ok()) << status.ToString();
  EXPECT_TRUE(MessageDifferencer::Equals(parsed, IrisDataset()));
}

TEST(ToJsonTest, PrettyJsonIsIndentedWithoutTrailingNewline) {
  const absl::StatusOr<std::string> json = ToJson(IrisDataset(), /*pretty=*/true);
  ASSERT_TRUE(json.ok()) << json.status();
  EXPECT_THAT(*json, StartsWith("{\n"));
  EXPECT_THAT(*json, EndsWith("}"));
}

TEST(ToJsonTest, CompactJsonIsOneLineForJsonLines) {
  v1::JobEvent event;
  event.mutable_epoch()->set_epoch(3);
  event.mutable_epoch()->set_loss(0.25);
  event.mutable_epoch()->set_elapsed_seconds(1.5);
  event.mutable_epoch()->set_learning_rate(0.01);
  const absl::StatusOr<std::string> json = ToJson(event, /*pretty=*/false);
  ASSERT_TRUE(json.ok()) << json.status();
  EXPECT_EQ(*json,
            "{\"epoch\":{\"epoch\":3,\"loss\":0.25,\"elapsed_seconds\":1.5,"
            "\"learning_rate\":0.01}}");
}

TEST(ToJsonTest, CompactJobHasNoNewline) {
  const absl::StatusOr<std::string> json = ToJson(SucceededJob(), /*pretty=*/false);
  ASSERT_TRUE(json.ok()) << json.status();
  EXPECT_THAT(*json, Not(HasSubstr("\n")));
  EXPECT_THAT(*json, ContainsRegex("\"host_syncs\":\"5\""));
}

TEST(JobDetailsTest, Fp16ShowsTheLastScaleAndAllSkippedSteps) {
  v1::Job job = SucceededJob();
  job.mutable_spec()->set_precision(v1::PRECISION_FP16);
  v1::EpochResult* first = job.add_epochs();
  first->set_epoch(1);
  first->set_loss_scale(8192);
  first->set_skipped_steps(3);
  v1::EpochResult* second = job.add_epochs();
  second->set_epoch(2);
  second->set_loss_scale(16384);

  EXPECT_THAT(JobDetails(job),
              HasSubstr("\nprecision:   fp16 (autocast, loss scaling: scale 16384, 3 steps "
                        "skipped)\n"));
  EXPECT_THAT(EpochLine(*first, 2), EndsWith("  scale 8192  skipped 3"));
  EXPECT_THAT(EpochLine(*second, 2), EndsWith("  scale 16384"));
}

TEST(JobDetailsTest, Bf16IsNamedAndFp32IsNotShown) {
  v1::Job job = SucceededJob();
  EXPECT_THAT(JobDetails(job), Not(HasSubstr("precision")));
  job.mutable_spec()->set_precision(v1::PRECISION_BF16);
  EXPECT_THAT(JobDetails(job), HasSubstr("\nprecision:   bf16 (autocast)\n"));
}

}  // namespace
}  // namespace trainerd::client

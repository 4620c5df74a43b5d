// SqliteJobStore on real database files: records round-trip with their epochs, listings page and
// filter, retention picks the right jobs, the schema is versioned, and damaged or foreign files are
// refused with a sentence instead of being overwritten.
#include "server/store/sqlite_job_store.h"

#include <sqlite3.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/damaged_record.h"

namespace trainerd::store {
namespace {

using engine::EpochResult;
using engine::JobQuery;
using engine::JobSnapshot;
using engine::JobState;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

std::string ScratchFile(const std::string& name) {
  static int counter = 0;
  const std::string path = absl::StrCat(::testing::TempDir(), "trainerd-store-", name, "-",
                                        ::getpid(), "-", counter++, ".db");
  std::remove(path.c_str());
  std::remove((path + "-wal").c_str());
  std::remove((path + "-shm").c_str());
  return path;
}

JobSnapshot MakeJob(const std::string& id, const std::string& dataset,
                    JobState state = JobState::kQueued) {
  JobSnapshot job;
  job.id = id;
  job.spec.dataset = dataset;
  job.spec.model = "mlp:4-8-1";
  job.spec.learning_rate = 0.05;
  job.spec.batch_size = 16;
  job.spec.epochs = 5;
  job.spec.seed = 42;
  job.spec.device = "cpu";
  job.spec.checkpoint_every = 2;
  job.spec.priority = engine::JobPriority::kHigh;
  job.owner = "alice";
  job.state = state;
  job.device = "cpu";
  job.create_time = absl::FromUnixSeconds(1'700'000'000);
  return job;
}

EpochResult MakeEpoch(int32_t epoch, double loss) {
  EpochResult result;
  result.epoch = epoch;
  result.loss = loss;
  result.elapsed_seconds = 0.25 * epoch;
  result.learning_rate = 0.05;
  result.validation_loss = loss * 2;
  return result;
}

std::unique_ptr<SqliteJobStore> OpenOrDie(const std::string& path) {
  absl::StatusOr<std::unique_ptr<SqliteJobStore>> store = SqliteJobStore::Open(path);
  EXPECT_TRUE(store.ok()) << store.status();
  return store.ok() ? *std::move(store) : nullptr;
}

std::vector<std::string> Ids(const engine::JobPage& page) {
  std::vector<std::string> ids;
  for (const JobSnapshot& job : page.jobs) ids.push_back(job.id);
  return ids;
}

TEST(SqliteJobStoreTest, JobAndEpochsRoundTripAcrossReopen) {
  const std::string path = ScratchFile("roundtrip");
  {
    auto store = OpenOrDie(path);
    ASSERT_NE(store, nullptr);
    JobSnapshot job = MakeJob("job-1", "xor");
    ASSERT_TRUE(store->SaveJob(job).ok());
    job.state = JobState::kRunning;
    job.start_time = absl::FromUnixSeconds(1'700'000'010);
    ASSERT_TRUE(store->SaveJob(job).ok());
    job.steps = 4;
    job.final_loss = 0.5;
    ASSERT_TRUE(store->AppendEpoch(job, MakeEpoch(1, 0.5)).ok());
    job.steps = 8;
    job.final_loss = 0.25;
    engine::CheckpointInfo checkpoint;
    checkpoint.epoch = 2;
    checkpoint.path = "checkpoints/job-1/epoch-000002.pt";
    checkpoint.size_bytes = 1234;
    checkpoint.create_time = absl::FromUnixSeconds(1'700'000'020);
    job.checkpoints.push_back(checkpoint);
    ASSERT_TRUE(store->AppendEpoch(job, MakeEpoch(2, 0.25)).ok());
  }
  auto store = OpenOrDie(path);
  ASSERT_NE(store, nullptr);
  absl::StatusOr<JobSnapshot> loaded = store->LoadJob("job-1");
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->state, JobState::kRunning);
  EXPECT_EQ(loaded->spec.dataset, "xor");
  EXPECT_EQ(loaded->spec.model, "mlp:4-8-1");
  EXPECT_EQ(loaded->spec.seed, 42u);
  EXPECT_EQ(loaded->spec.checkpoint_every, 2);
  EXPECT_EQ(loaded->spec.priority, engine::JobPriority::kHigh);
  EXPECT_EQ(loaded->owner, "alice");
  EXPECT_EQ(loaded->steps, 8);
  EXPECT_DOUBLE_EQ(loaded->final_loss, 0.25);
  EXPECT_EQ(loaded->create_time, absl::FromUnixSeconds(1'700'000'000));
  EXPECT_EQ(loaded->start_time, absl::FromUnixSeconds(1'700'000'010));
  EXPECT_EQ(loaded->end_time, absl::InfinitePast());
  ASSERT_EQ(loaded->epochs.size(), 2u);
  EXPECT_EQ(loaded->epochs_completed, 2);
  EXPECT_EQ(loaded->epochs[0].epoch, 1);
  EXPECT_DOUBLE_EQ(loaded->epochs[0].loss, 0.5);
  EXPECT_DOUBLE_EQ(*loaded->epochs[1].validation_loss, 0.5);
  ASSERT_EQ(loaded->checkpoints.size(), 1u);
  EXPECT_EQ(loaded->checkpoints[0].path, "checkpoints/job-1/epoch-000002.pt");
  EXPECT_EQ(loaded->checkpoints[0].size_bytes, 1234);

  EXPECT_EQ(store->LoadJob("job-2").status().code(), absl::StatusCode::kNotFound);
}

// Several epochs of several jobs at once (a pack's epochs that waited): every epoch's row, and
// each job's figures as its last epoch in the write leaves them, whatever the order between jobs.
TEST(SqliteJobStoreTest, AppendEpochsKeepsEveryEpochAndEachJobsLastFigures) {
  const std::string path = ScratchFile("append-epochs");
  auto store = OpenOrDie(path);
  ASSERT_NE(store, nullptr);
  std::vector<JobSnapshot> after;  // [job * 3 + epoch - 1]: the figures after each epoch
  std::vector<EpochResult> epochs;
  for (const std::string id : {"job-a", "job-b"}) {
    JobSnapshot job = MakeJob(id, "d", JobState::kRunning);
    ASSERT_TRUE(store->SaveJob(job).ok());
    for (int32_t epoch = 1; epoch <= 3; ++epoch) {
      job.steps = epoch * 10;
      job.final_loss = 1.0 / epoch;
      after.push_back(job);
      epochs.push_back(MakeEpoch(epoch, 1.0 / epoch));
    }
  }
  // Interleaved as a pack queues them: epoch 1 of each, then 2 of each, then 3 of each.
  std::vector<std::pair<const JobSnapshot*, const EpochResult*>> write;
  for (int epoch = 0; epoch < 3; ++epoch) {
    for (int job = 0; job < 2; ++job)
      write.emplace_back(&after[job * 3 + epoch], &epochs[job * 3 + epoch]);
  }
  ASSERT_TRUE(store->AppendEpochs(write).ok());
  store.reset();
  store = OpenOrDie(path);
  for (const std::string id : {"job-a", "job-b"}) {
    absl::StatusOr<JobSnapshot> loaded = store->LoadJob(id);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    EXPECT_EQ(loaded->state, JobState::kRunning);
    EXPECT_EQ(loaded->steps, 30);
    EXPECT_DOUBLE_EQ(loaded->final_loss, 1.0 / 3);
    ASSERT_EQ(loaded->epochs.size(), 3u);
    EXPECT_EQ(loaded->epochs_completed, 3);
    for (int32_t epoch = 1; epoch <= 3; ++epoch) {
      EXPECT_EQ(loaded->epochs[epoch - 1].epoch, epoch);
      EXPECT_DOUBLE_EQ(loaded->epochs[epoch - 1].loss, 1.0 / epoch);
    }
  }
}

TEST(SqliteJobStoreTest, ListsPageByPageWithFiltersAndViews) {
  auto store = OpenOrDie(ScratchFile("list"));
  ASSERT_NE(store, nullptr);
  for (int i = 1; i <= 5; ++i) {
    JobSnapshot job = MakeJob(absl::StrCat("job-", i), i % 2 == 0 ? "even" : "odd",
                              i <= 3 ? JobState::kSucceeded : JobState::kQueued);
    job.end_time = i <= 3 ? absl::FromUnixSeconds(1'700'000'100 + i) : absl::InfinitePast();
    ASSERT_TRUE(store->SaveJob(job).ok());
    ASSERT_TRUE(store->AppendEpoch(job, MakeEpoch(1, 1.0 / i)).ok());
  }

  JobQuery query;
  query.page_size = 2;
  absl::StatusOr<engine::JobPage> page = store->ListJobs(query);
  ASSERT_TRUE(page.ok()) << page.status();
  EXPECT_THAT(Ids(*page), ElementsAre("job-1", "job-2"));
  ASSERT_FALSE(page->next_page_token.empty());
  // The summary view: no epochs, but how many there are.
  EXPECT_TRUE(page->jobs[0].epochs.empty());
  EXPECT_EQ(page->jobs[0].epochs_completed, 1);

  query.page_token = page->next_page_token;
  page = store->ListJobs(query);
  ASSERT_TRUE(page.ok());
  EXPECT_THAT(Ids(*page), ElementsAre("job-3", "job-4"));
  query.page_token = page->next_page_token;
  page = store->ListJobs(query);
  ASSERT_TRUE(page.ok());
  EXPECT_THAT(Ids(*page), ElementsAre("job-5"));
  EXPECT_TRUE(page->next_page_token.empty());

  JobQuery newest;
  newest.newest_first = true;
  newest.page_size = 3;
  page = store->ListJobs(newest);
  ASSERT_TRUE(page.ok());
  EXPECT_THAT(Ids(*page), ElementsAre("job-5", "job-4", "job-3"));
  newest.page_token = page->next_page_token;
  page = store->ListJobs(newest);
  ASSERT_TRUE(page.ok());
  EXPECT_THAT(Ids(*page), ElementsAre("job-2", "job-1"));

  JobQuery by_state;
  by_state.state = JobState::kQueued;
  by_state.full = true;
  page = store->ListJobs(by_state);
  ASSERT_TRUE(page.ok());
  EXPECT_THAT(Ids(*page), ElementsAre("job-4", "job-5"));
  ASSERT_EQ(page->jobs[0].epochs.size(), 1u);  // the full view
  EXPECT_DOUBLE_EQ(page->jobs[0].epochs[0].loss, 0.25);

  JobQuery by_dataset;
  by_dataset.dataset = "even";
  page = store->ListJobs(by_dataset);
  ASSERT_TRUE(page.ok());
  EXPECT_THAT(Ids(*page), ElementsAre("job-2", "job-4"));

  JobQuery bad;
  bad.page_token = "not-a-token";
  EXPECT_EQ(store->ListJobs(bad).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(SqliteJobStoreTest, UnfinishedJobsComeBackOldestFirstWithTheirEpochs) {
  auto store = OpenOrDie(ScratchFile("unfinished"));
  ASSERT_NE(store, nullptr);
  JobSnapshot done = MakeJob("job-a", "d", JobState::kSucceeded);
  JobSnapshot running = MakeJob("job-b", "d", JobState::kRunning);
  JobSnapshot queued = MakeJob("job-c", "d", JobState::kQueued);
  for (const JobSnapshot* job : {&done, &running, &queued}) ASSERT_TRUE(store->SaveJob(*job).ok());
  ASSERT_TRUE(store->AppendEpoch(running, MakeEpoch(1, 0.9)).ok());
  ASSERT_TRUE(store->AppendEpoch(running, MakeEpoch(2, 0.8)).ok());
  ASSERT_TRUE(store->AppendEpoch(running, MakeEpoch(3, 0.7)).ok());

  absl::StatusOr<std::vector<JobSnapshot>> unfinished = store->LoadUnfinishedJobs();
  ASSERT_TRUE(unfinished.ok()) << unfinished.status();
  ASSERT_EQ(unfinished->size(), 2u);
  EXPECT_EQ((*unfinished)[0].id, "job-b");
  EXPECT_EQ((*unfinished)[0].epochs.size(), 3u);
  EXPECT_EQ((*unfinished)[1].id, "job-c");

  // A resume from the checkpoint of epoch 2 runs epoch 3 again.
  ASSERT_TRUE(store->DeleteEpochsAfter("job-b", 2).ok());
  absl::StatusOr<JobSnapshot> b = store->LoadJob("job-b");
  ASSERT_TRUE(b.ok());
  ASSERT_EQ(b->epochs.size(), 2u);
  EXPECT_EQ(b->epochs.back().epoch, 2);
}

TEST(SqliteJobStoreTest, DeleteForgetsTheJobAndItsEpochs) {
  const std::string path = ScratchFile("delete");
  auto store = OpenOrDie(path);
  ASSERT_NE(store, nullptr);
  JobSnapshot job = MakeJob("job-x", "d", JobState::kSucceeded);
  ASSERT_TRUE(store->SaveJob(job).ok());
  ASSERT_TRUE(store->AppendEpoch(job, MakeEpoch(1, 0.5)).ok());
  ASSERT_TRUE(store->DeleteJob("job-x").ok());
  EXPECT_EQ(store->LoadJob("job-x").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store->DeleteJob("job-x").code(), absl::StatusCode::kNotFound);

  // No orphaned epoch rows stay behind.
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr), SQLITE_OK);
  sqlite3_stmt* count = nullptr;
  ASSERT_EQ(sqlite3_prepare_v2(db, "SELECT COUNT(*) FROM epochs", -1, &count, nullptr), SQLITE_OK);
  ASSERT_EQ(sqlite3_step(count), SQLITE_ROW);
  EXPECT_EQ(sqlite3_column_int64(count, 0), 0);
  sqlite3_finalize(count);
  sqlite3_close(db);
}

TEST(SqliteJobStoreTest, RetentionPicksTheOldestEndedJobs) {
  auto store = OpenOrDie(ScratchFile("prune"));
  ASSERT_NE(store, nullptr);
  // job-1..job-4 ended at t+1..t+4; job-5 still runs.
  const absl::Time t = absl::FromUnixSeconds(1'700'000'000);
  for (int i = 1; i <= 5; ++i) {
    JobSnapshot job =
        MakeJob(absl::StrCat("job-", i), "d", i <= 4 ? JobState::kFailed : JobState::kRunning);
    if (i <= 4) job.end_time = t + absl::Seconds(i);
    ASSERT_TRUE(store->SaveJob(job).ok());
  }
  absl::StatusOr<std::vector<std::string>> doomed =
      store->EndedJobsToPrune(2, absl::InfinitePast());
  ASSERT_TRUE(doomed.ok()) << doomed.status();
  EXPECT_THAT(*doomed, ElementsAre("job-1", "job-2"));

  doomed = store->EndedJobsToPrune(-1, t + absl::Seconds(3));  // ended before t+3
  ASSERT_TRUE(doomed.ok());
  EXPECT_THAT(*doomed, ElementsAre("job-1", "job-2"));

  doomed = store->EndedJobsToPrune(3, t + absl::Seconds(2));  // both limits: the union
  ASSERT_TRUE(doomed.ok());
  EXPECT_THAT(*doomed, ElementsAre("job-1"));

  doomed = store->EndedJobsToPrune(0, absl::InfinitePast());
  ASSERT_TRUE(doomed.ok());
  EXPECT_THAT(*doomed, ElementsAre("job-1", "job-2", "job-3", "job-4"));
}

TEST(SqliteJobStoreTest, RefusesANewerSchemaAndForeignFiles) {
  const std::string newer = ScratchFile("newer");
  { ASSERT_NE(OpenOrDie(newer), nullptr); }
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(newer.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, "UPDATE meta SET value = 99 WHERE key = 'schema_version'", nullptr,
                         nullptr, nullptr),
            SQLITE_OK);
  sqlite3_close(db);
  absl::StatusOr<std::unique_ptr<SqliteJobStore>> store = SqliteJobStore::Open(newer);
  ASSERT_EQ(store.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(store.status().message(), HasSubstr("newer trainerd (schema 99"));

  const std::string garbage = ScratchFile("garbage");
  {
    std::ofstream out(garbage, std::ios::binary);
    out << std::string(8192, 'x');
  }
  store = SqliteJobStore::Open(garbage);
  ASSERT_EQ(store.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(store.status().message(), HasSubstr(garbage));
  // Refused, not overwritten.
  std::ifstream in(garbage, std::ios::binary);
  std::string contents((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(contents, std::string(8192, 'x'));
}

// A damaged jobs.db never keeps the daemon from starting: it is moved aside, kept, and a new one
// made. A newer schema is not damage: still refused.
TEST(SqliteJobStoreTest, ADamagedFileIsMovedAsideAndANewOneMade) {
  const std::string garbage = ScratchFile("aside");
  {
    std::ofstream out(garbage, std::ios::binary);
    out << std::string(8192, 'x');
  }
  std::string note;
  absl::StatusOr<std::unique_ptr<SqliteJobStore>> store =
      SqliteJobStore::OpenOrSetAside(garbage, &note);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_THAT(note, HasSubstr("are damaged"));
  EXPECT_THAT(note, HasSubstr(garbage + ".damaged-"));
  absl::StatusOr<engine::JobPage> page = (*store)->ListJobs(JobQuery());
  ASSERT_TRUE(page.ok());
  EXPECT_TRUE(page->jobs.empty());
  ASSERT_TRUE((*store)->SaveJob(MakeJob("job-1", "d")).ok());
  // The damaged file is kept beside it, byte for byte.
  const std::string aside = note.substr(note.find(garbage + ".damaged-"));
  const std::string aside_path = aside.substr(0, aside.find('\''));
  std::ifstream in(aside_path, std::ios::binary);
  std::string contents((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(contents, std::string(8192, 'x'));
  std::remove(aside_path.c_str());
}

TEST(SqliteJobStoreTest, ADamagedRecordIsShownAsDamagedAndNeverFailsAListing) {
  const std::string path = ScratchFile("damaged");
  {
    auto store = OpenOrDie(path);
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(store->SaveJob(MakeJob("job-1", "d", JobState::kSucceeded)).ok());
    ASSERT_TRUE(store->SaveJob(MakeJob("job-2", "d", JobState::kSucceeded)).ok());
    ASSERT_TRUE(store->SaveJob(MakeJob("job-3", "d", JobState::kRunning)).ok());
    ASSERT_TRUE(store->SaveJob(MakeJob("job-4", "d", JobState::kQueued)).ok());
  }
  trainerd::testing::DamageJobRecord(path, "job-2");
  trainerd::testing::DamageJobRecord(path, "job-3");
  auto store = OpenOrDie(path);
  ASSERT_NE(store, nullptr);
  for (const bool full : {false, true}) {
    JobQuery query;
    query.full = full;
    absl::StatusOr<engine::JobPage> page = store->ListJobs(query);
    ASSERT_TRUE(page.ok()) << page.status();
    ASSERT_THAT(Ids(*page), ElementsAre("job-1", "job-2", "job-3", "job-4"));
    EXPECT_TRUE(page->jobs[0].record_damaged.empty());
    EXPECT_THAT(page->jobs[1].record_damaged, HasSubstr("the record of job 'job-2' is damaged"));
    EXPECT_EQ(page->jobs[1].state, JobState::kSucceeded);  // from the row's column
    EXPECT_EQ(page->jobs[2].state, JobState::kRunning);
  }
  EXPECT_EQ(store->LoadJob("job-2").status().code(), absl::StatusCode::kDataLoss);
  // The unfinished one comes back marked, for the engine to set aside; the other resumes.
  absl::StatusOr<std::vector<JobSnapshot>> unfinished = store->LoadUnfinishedJobs();
  ASSERT_TRUE(unfinished.ok()) << unfinished.status();
  ASSERT_EQ(unfinished->size(), 2u);
  EXPECT_EQ((*unfinished)[0].id, "job-3");
  EXPECT_FALSE((*unfinished)[0].record_damaged.empty());
  EXPECT_EQ((*unfinished)[1].id, "job-4");
  EXPECT_TRUE((*unfinished)[1].record_damaged.empty());
  EXPECT_EQ((*unfinished)[1].spec.dataset, "d");
}

TEST(SqliteJobStoreTest, PageTokensAreSignedForTheirFiltersAndOwnersFilterTheListing) {
  auto store = OpenOrDie(ScratchFile("tokens"));
  ASSERT_NE(store, nullptr);
  for (int i = 1; i <= 6; ++i) {
    JobSnapshot job = MakeJob(absl::StrCat("job-", i), "d");
    job.owner = i % 2 == 0 ? "bob" : "alice";
    ASSERT_TRUE(store->SaveJob(job).ok());
  }
  JobQuery alices;
  alices.owner = "alice";
  alices.page_size = 2;
  absl::StatusOr<engine::JobPage> page = store->ListJobs(alices);
  ASSERT_TRUE(page.ok());
  EXPECT_THAT(Ids(*page), ElementsAre("job-1", "job-3"));
  ASSERT_EQ(page->resume_tokens.size(), 2u);
  EXPECT_EQ(page->resume_tokens[1], page->next_page_token);
  alices.page_token = page->next_page_token;
  page = store->ListJobs(alices);
  ASSERT_TRUE(page.ok());
  EXPECT_THAT(Ids(*page), ElementsAre("job-5"));
  // Another filter, another owner, an edited token, the old format: refused.
  JobQuery bobs = alices;
  bobs.owner = "bob";
  EXPECT_EQ(store->ListJobs(bobs).status().code(), absl::StatusCode::kInvalidArgument);
  JobQuery everyone = alices;
  everyone.owner.reset();
  EXPECT_EQ(store->ListJobs(everyone).status().code(), absl::StatusCode::kInvalidArgument);
  for (const std::string& forged :
       {std::string("seq-0"), std::string("seq-+3"), std::string("p1.0.0123456789abcdef"),
        "p1.1" + alices.page_token.substr(alices.page_token.find('.', 3))}) {
    JobQuery query = alices;
    query.page_token = forged;
    EXPECT_EQ(store->ListJobs(query).status().code(), absl::StatusCode::kInvalidArgument) << forged;
  }
}

TEST(SqliteJobStoreTest, EpochsArePagedFromTheRecords) {
  auto store = OpenOrDie(ScratchFile("epochs"));
  ASSERT_NE(store, nullptr);
  JobSnapshot job = MakeJob("job-1", "d", JobState::kRunning);
  ASSERT_TRUE(store->SaveJob(job).ok());
  for (int e = 1; e <= 10; ++e) ASSERT_TRUE(store->AppendEpoch(job, MakeEpoch(e, 1.0 / e)).ok());
  absl::StatusOr<std::vector<EpochResult>> page = store->LoadEpochs("job-1", 3, 4);
  ASSERT_TRUE(page.ok()) << page.status();
  ASSERT_EQ(page->size(), 4u);
  EXPECT_EQ((*page)[0].epoch, 4);
  EXPECT_EQ((*page)[3].epoch, 7);
  EXPECT_EQ(store->LoadEpochs("job-1", 10, 4)->size(), 0u);
  EXPECT_EQ(store->LoadEpochs("job-9", 0, 4).status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(store->Sync().ok());
}

// A database of schema 1 (before owners were a column) is migrated at open: its jobs keep their
// owners, and a tenant's listing finds them.
TEST(SqliteJobStoreTest, ASchemaOneFileIsMigratedWithItsOwners) {
  const std::string path = ScratchFile("migrate");
  {
    auto store = OpenOrDie(path);
    ASSERT_NE(store, nullptr);
    JobSnapshot job = MakeJob("job-1", "d");
    job.owner = "carol";
    ASSERT_TRUE(store->SaveJob(job).ok());
  }
  // Back to schema 1: without the column, as a build before it wrote the file.
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  for (const char* sql : {"DROP INDEX jobs_by_sweep", "ALTER TABLE jobs DROP COLUMN sweep_id",
                          "DROP INDEX jobs_by_request", "ALTER TABLE jobs DROP COLUMN request_id",
                          "ALTER TABLE jobs DROP COLUMN request_digest", "DROP INDEX jobs_by_owner",
                          "ALTER TABLE jobs DROP COLUMN owner",
                          "UPDATE meta SET value = 1 WHERE key = 'schema_version'"}) {
    ASSERT_EQ(sqlite3_exec(db, sql, nullptr, nullptr, nullptr), SQLITE_OK) << sql;
  }
  sqlite3_close(db);
  auto store = OpenOrDie(path);
  ASSERT_NE(store, nullptr);
  JobQuery carols;
  carols.owner = "carol";
  absl::StatusOr<engine::JobPage> page = store->ListJobs(carols);
  ASSERT_TRUE(page.ok()) << page.status();
  EXPECT_THAT(Ids(*page), ElementsAre("job-1"));
}

// A database of schema 2 (before request ids) is migrated at open: its jobs have none, and the
// jobs saved after it do, found by them with the digest they were saved with.
TEST(SqliteJobStoreTest, ASchemaTwoFileIsMigratedAndRequestIdsFindTheirJobs) {
  const std::string path = ScratchFile("request-ids");
  {
    auto store = OpenOrDie(path);
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(store->SaveJob(MakeJob("job-old", "d")).ok());
  }
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  for (const char* sql : {"DROP INDEX jobs_by_sweep", "ALTER TABLE jobs DROP COLUMN sweep_id",
                          "DROP INDEX jobs_by_request", "ALTER TABLE jobs DROP COLUMN request_id",
                          "ALTER TABLE jobs DROP COLUMN request_digest",
                          "UPDATE meta SET value = 2 WHERE key = 'schema_version'"}) {
    ASSERT_EQ(sqlite3_exec(db, sql, nullptr, nullptr, nullptr), SQLITE_OK) << sql;
  }
  sqlite3_close(db);
  auto store = OpenOrDie(path);
  ASSERT_NE(store, nullptr);
  for (int i = 1; i <= 3; ++i) {
    JobSnapshot job = MakeJob(absl::StrCat("job-", i), "d");
    job.owner = i == 3 ? "bob" : "alice";
    job.request_id = i == 1 ? "" : "sweep-7";
    job.request_digest = absl::StrCat("digest-", i);
    ASSERT_TRUE(store->SaveJob(job).ok());
  }
  JobQuery query;
  query.owner = "alice";
  query.request_id = "sweep-7";
  absl::StatusOr<engine::JobPage> page = store->ListJobs(query);
  ASSERT_TRUE(page.ok()) << page.status();
  EXPECT_THAT(Ids(*page), ElementsAre("job-2"));
  EXPECT_EQ(page->jobs[0].request_id, "sweep-7");
  EXPECT_EQ(page->jobs[0].request_digest, "digest-2");
  EXPECT_EQ(store->LoadJob("job-2")->request_id, "sweep-7");
  query.owner = "bob";
  EXPECT_THAT(Ids(*store->ListJobs(query)), ElementsAre("job-3"));
  // Unfiltered, every job, the migrated one too; a page token is bound to its request id.
  JobQuery all;
  all.page_size = 1;
  page = store->ListJobs(all);
  ASSERT_TRUE(page.ok());
  EXPECT_THAT(Ids(*page), ElementsAre("job-old"));
  all.page_token = page->next_page_token;
  all.request_id = "sweep-7";
  EXPECT_EQ(store->ListJobs(all).status().code(), absl::StatusCode::kInvalidArgument);
}

// A database of schema 3 (before sweep ids were a column) is migrated at open: its sweeps'
// members are found by their sweep id, in their order, as are those saved after.
TEST(SqliteJobStoreTest, ASchemaThreeFileIsMigratedAndASweepsMembersAreFoundInOrder) {
  const std::string path = ScratchFile("sweep-ids");
  {
    auto store = OpenOrDie(path);
    ASSERT_NE(store, nullptr);
    for (const auto& [id, sweep] :
         std::vector<std::pair<std::string, std::string>>{{"job-a1", "sweep-a"},
                                                          {"job-alone", ""},
                                                          {"job-a2", "sweep-a"},
                                                          {"job-b1", "sweep-b"}}) {
      JobSnapshot job = MakeJob(id, "d");
      job.owner = "alice";
      job.sweep_id = sweep;
      ASSERT_TRUE(store->SaveJob(job).ok());
    }
  }
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  for (const char* sql : {"DROP INDEX jobs_by_sweep", "ALTER TABLE jobs DROP COLUMN sweep_id",
                          "UPDATE meta SET value = 3 WHERE key = 'schema_version'"}) {
    ASSERT_EQ(sqlite3_exec(db, sql, nullptr, nullptr, nullptr), SQLITE_OK) << sql;
  }
  sqlite3_close(db);
  auto store = OpenOrDie(path);
  ASSERT_NE(store, nullptr);
  JobSnapshot later = MakeJob("job-a3", "d");
  later.owner = "alice";
  later.sweep_id = "sweep-a";
  ASSERT_TRUE(store->SaveJob(later).ok());
  JobQuery query;
  query.sweep_id = "sweep-a";
  absl::StatusOr<engine::JobPage> page = store->ListJobs(query);
  ASSERT_TRUE(page.ok()) << page.status();
  EXPECT_THAT(Ids(*page), ElementsAre("job-a1", "job-a2", "job-a3"));
  EXPECT_EQ(page->jobs[0].sweep_id, "sweep-a");
  query.sweep_id = "sweep-b";
  EXPECT_THAT(Ids(*store->ListJobs(query)), ElementsAre("job-b1"));
  // With the owner: another tenant's sweep id finds nothing.
  query.owner = "bob";
  EXPECT_THAT(Ids(*store->ListJobs(query)), IsEmpty());
  query.sweep_id = "sweep-none";
  query.owner.reset();
  EXPECT_THAT(Ids(*store->ListJobs(query)), IsEmpty());
  // Pages of one, oldest first; a page token is bound to its sweep id.
  JobQuery paged;
  paged.sweep_id = "sweep-a";
  paged.page_size = 1;
  page = store->ListJobs(paged);
  ASSERT_TRUE(page.ok());
  EXPECT_THAT(Ids(*page), ElementsAre("job-a1"));
  paged.page_token = page->next_page_token;
  EXPECT_THAT(Ids(*store->ListJobs(paged)), ElementsAre("job-a2"));
  paged.sweep_id = "sweep-b";
  EXPECT_EQ(store->ListJobs(paged).status().code(), absl::StatusCode::kInvalidArgument);
}

// An older data folder's datasets (one namespace for every tenant) move to their owners' names:
// the records that name one by its old name, as dataset or validation dataset, are rewritten to
// its key, in the record and the listing's column, durably; a second rename changes nothing.
TEST(SqliteJobStoreTest, RenameDatasetsRewritesTheRecordsThatNameThem) {
  const std::string path = ScratchFile("rename");
  {
    auto store = OpenOrDie(path);
    ASSERT_TRUE(store->SaveJob(MakeJob("job-a", "digits", JobState::kSucceeded)).ok());
    JobSnapshot validated = MakeJob("job-b", "other");
    validated.spec.validation_dataset = "digits";
    ASSERT_TRUE(store->SaveJob(validated).ok());
    ASSERT_TRUE(store->SaveJob(MakeJob("job-c", "unowned")).ok());
    ASSERT_TRUE(store->AppendEpoch(MakeJob("job-c", "unowned"), MakeEpoch(1, 0.5)).ok());
    const std::map<std::string, std::string> renames = {{"digits", "alice/digits"},
                                                        {"other", "bob/other"}};
    ASSERT_TRUE(store->RenameDatasets(renames).ok());
    ASSERT_TRUE(store->RenameDatasets(renames).ok());  // keys are no old names: nothing more
  }
  auto store = OpenOrDie(path);
  EXPECT_EQ(store->LoadJob("job-a")->spec.dataset, "alice/digits");
  EXPECT_EQ(store->LoadJob("job-b")->spec.dataset, "bob/other");
  EXPECT_EQ(store->LoadJob("job-b")->spec.validation_dataset, "alice/digits");
  const absl::StatusOr<JobSnapshot> unowned = store->LoadJob("job-c");
  EXPECT_EQ(unowned->spec.dataset, "unowned");  // no owner: its name is its key
  EXPECT_EQ(unowned->epochs.size(), 1u);
  JobQuery query;
  query.dataset = "alice/digits";
  EXPECT_THAT(Ids(*store->ListJobs(query)), ElementsAre("job-a"));
  query.dataset = "digits";
  EXPECT_THAT(Ids(*store->ListJobs(query)), IsEmpty());
}

TEST(SqliteJobStoreTest, ReopeningKeepsTheSchemaVersion) {
  const std::string path = ScratchFile("version");
  { ASSERT_NE(OpenOrDie(path), nullptr); }
  { ASSERT_NE(OpenOrDie(path), nullptr); }
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr), SQLITE_OK);
  sqlite3_stmt* read = nullptr;
  ASSERT_EQ(sqlite3_prepare_v2(db, "SELECT value FROM meta WHERE key = 'schema_version'", -1, &read,
                               nullptr),
            SQLITE_OK);
  ASSERT_EQ(sqlite3_step(read), SQLITE_ROW);
  EXPECT_EQ(sqlite3_column_int(read, 0), kJobStoreSchemaVersion);
  sqlite3_finalize(read);
  // WAL mode sticks to the file.
  sqlite3_stmt* mode = nullptr;
  ASSERT_EQ(sqlite3_prepare_v2(db, "PRAGMA journal_mode", -1, &mode, nullptr), SQLITE_OK);
  ASSERT_EQ(sqlite3_step(mode), SQLITE_ROW);
  EXPECT_STREQ(reinterpret_cast<const char*>(sqlite3_column_text(mode, 0)), "wal");
  sqlite3_finalize(mode);
  sqlite3_close(db);
}

TEST(SqliteJobStoreTest, ListingsReadWhileEpochsAreWritten) {
  auto store = OpenOrDie(ScratchFile("concurrent"));
  ASSERT_NE(store, nullptr);
  JobSnapshot job = MakeJob("job-w", "d", JobState::kRunning);
  ASSERT_TRUE(store->SaveJob(job).ok());
  std::atomic<bool> failed{false};
  std::thread writer([&] {
    for (int epoch = 1; epoch <= 200; ++epoch) {
      job.steps = epoch;
      if (!store->AppendEpoch(job, MakeEpoch(epoch, 1.0 / epoch)).ok()) failed = true;
    }
  });
  int32_t last_seen = 0;
  for (int i = 0; i < 200; ++i) {
    JobQuery query;
    query.full = true;
    absl::StatusOr<engine::JobPage> page = store->ListJobs(query);
    ASSERT_TRUE(page.ok()) << page.status();
    ASSERT_EQ(page->jobs.size(), 1u);
    const JobSnapshot& seen = page->jobs[0];
    // A reader sees whole transactions: the record's steps match the epochs it has.
    EXPECT_EQ(seen.steps, static_cast<int64_t>(seen.epochs.size()));
    EXPECT_GE(static_cast<int32_t>(seen.epochs.size()), last_seen);
    last_seen = static_cast<int32_t>(seen.epochs.size());
  }
  writer.join();
  EXPECT_FALSE(failed);
  absl::StatusOr<JobSnapshot> loaded = store->LoadJob("job-w");
  ASSERT_TRUE(loaded.ok());
  EXPECT_EQ(loaded->epochs.size(), 200u);
}

}  // namespace
}  // namespace trainerd::store

// trainctl's contexts: the config file's round trip and checks, and which context fills which
// option (client/contexts.h).
#include "client/contexts.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainerd::client {
namespace {

using ::testing::HasSubstr;

class ContextsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           ("trainctl-contexts-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    path_ = (dir_ / "trainctl" / "config.yaml").string();
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  void Write(const std::string& text) {
    std::filesystem::create_directories(dir_ / "trainctl");
    std::ofstream(path_) << text;
  }

  ClientConfig TwoNodes() {
    ClientConfig config;
    config.current_context = "gpu1";
    config.contexts.push_back(
        {"gpu1", "gpu-node-1:50051", "/etc/t/gpu1.token", "/etc/t/ca.pem", "", "", ""});
    config.contexts.push_back({"gpu2", "gpu-node-2:50051", "/etc/t/gpu2.token", "", "/etc/t/c.pem",
                               "/etc/t/c.key", "node2.example"});
    return config;
  }

  std::filesystem::path dir_;
  std::string path_;
};

TEST_F(ContextsTest, ThePathFollowsTrainctlConfigThenXdgThenHome) {
  EXPECT_EQ(ConfigPath("/x/c.yaml", "/xdg", "/home/me"), "/x/c.yaml");
  EXPECT_EQ(ConfigPath(nullptr, "/xdg", "/home/me"), "/xdg/trainctl/config.yaml");
  EXPECT_EQ(ConfigPath("", "", "/home/me"), "/home/me/.config/trainctl/config.yaml");
}

TEST_F(ContextsTest, AMissingFileIsAnEmptyConfig) {
  absl::StatusOr<ClientConfig> config = LoadClientConfig(path_);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_TRUE(config->contexts.empty());
  EXPECT_EQ(config->current_context, "");
}

TEST_F(ContextsTest, SavedConfigLoadsBackWholeAndIsPrivate) {
  ASSERT_TRUE(SaveClientConfig(path_, TwoNodes()).ok());

  absl::StatusOr<ClientConfig> loaded = LoadClientConfig(path_);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->current_context, "gpu1");
  ASSERT_EQ(loaded->contexts.size(), 2u);
  const ClientContext& gpu2 = loaded->contexts[1];
  EXPECT_EQ(gpu2.name, "gpu2");
  EXPECT_EQ(gpu2.address, "gpu-node-2:50051");
  EXPECT_EQ(gpu2.token_file, "/etc/t/gpu2.token");
  EXPECT_EQ(gpu2.tls_ca, "");
  EXPECT_EQ(gpu2.tls_cert, "/etc/t/c.pem");
  EXPECT_EQ(gpu2.tls_key, "/etc/t/c.key");
  EXPECT_EQ(gpu2.tls_server_name, "node2.example");
  EXPECT_EQ(loaded->contexts[0].tls_ca, "/etc/t/ca.pem");
  struct stat file;
  ASSERT_EQ(::stat(path_.c_str(), &file), 0);
  EXPECT_EQ(file.st_mode & 0777, 0600u);
  ASSERT_EQ(::stat((dir_ / "trainctl").c_str(), &file), 0);
  EXPECT_EQ(file.st_mode & 0777, 0700u);
  EXPECT_FALSE(std::filesystem::exists(path_ + ".tmp"));
}

TEST_F(ContextsTest, AHandWrittenFileLoads) {
  Write(
      "current-context: lab\n"
      "contexts:\n"
      "  - name: lab\n"
      "    address: unix:/run/trainerd.sock\n"
      "  - {name: cloud, address: 10.0.0.7:50051, token-file: /t}\n");
  absl::StatusOr<ClientConfig> config = LoadClientConfig(path_);
  ASSERT_TRUE(config.ok()) << config.status();
  ASSERT_EQ(config->contexts.size(), 2u);
  EXPECT_EQ(config->Find("lab")->address, "unix:/run/trainerd.sock");
  EXPECT_EQ(config->Find("cloud")->token_file, "/t");
}

TEST_F(ContextsTest, MalformedFilesAreRefusedNamingTheFileAndTheProblem) {
  const std::pair<const char*, const char*> cases[] = {
      {"contexts: [ {name: a\n", "config file"},
      {"- a\n- b\n", "not a mapping"},
      {"contexts: {name: a}\n", "contexts is not a list"},
      {"contexts:\n  - address: x:1\n", "a context has no name"},
      {"contexts:\n  - {name: a, adress: x:1}\n", "unknown key 'adress'"},
      {"curent-context: a\n", "unknown key 'curent-context'"},
      {"contexts:\n  - {name: a}\n  - {name: a}\n", "appears twice"},
      {"contexts:\n  - {name: a, address: [x]}\n", "'address' is not a string"},
  };
  for (const auto& [text, why] : cases) {
    Write(text);
    absl::StatusOr<ClientConfig> config = LoadClientConfig(path_);
    ASSERT_FALSE(config.ok()) << text;
    EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_THAT(config.status().message(), HasSubstr(path_)) << text;
    EXPECT_THAT(config.status().message(), HasSubstr(why)) << text;
  }
}

TEST_F(ContextsTest, AFileOverOneMebibyteIsRefused) {
  Write("contexts:\n" + std::string(2 << 20, '#') + "\n");
  absl::StatusOr<ClientConfig> config = LoadClientConfig(path_);
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(config.status().message(), HasSubstr("larger than 1 MiB"));
}

TEST_F(ContextsTest, TheCurrentContextFillsWhatNoFlagGives) {
  GlobalOptions global;
  ASSERT_TRUE(ApplyContext(TwoNodes(), path_, global).ok());
  EXPECT_EQ(global.address, "gpu-node-1:50051");
  EXPECT_EQ(global.token_file, "/etc/t/gpu1.token");
  EXPECT_EQ(global.tls_ca, "/etc/t/ca.pem");

  GlobalOptions flagged;
  flagged.token_file = "/mine.token";
  ASSERT_TRUE(ApplyContext(TwoNodes(), path_, flagged).ok());
  EXPECT_EQ(flagged.token_file, "/mine.token");
  EXPECT_EQ(flagged.address, "gpu-node-1:50051");
}

TEST_F(ContextsTest, AnAddressFromAFlagOrTheEnvironmentNeverGetsTheCurrentContextsToken) {
  for (const bool from_env : {false, true}) {
    GlobalOptions global;
    global.address = "elsewhere:50051";
    (from_env ? global.address_from_env : global.address_given) = true;
    ASSERT_TRUE(ApplyContext(TwoNodes(), path_, global).ok());
    EXPECT_EQ(global.address, "elsewhere:50051");
    EXPECT_EQ(global.token_file, "") << "from_env " << from_env;
    EXPECT_EQ(global.tls_ca, "");
  }
}

TEST_F(ContextsTest, ANamedContextWinsOverTheCurrentOneAndTheEnvironment) {
  GlobalOptions global;
  global.context = "gpu2";
  global.address = "from-env:1";
  global.address_from_env = true;
  ASSERT_TRUE(ApplyContext(TwoNodes(), path_, global).ok());
  EXPECT_EQ(global.address, "gpu-node-2:50051");
  EXPECT_EQ(global.token_file, "/etc/t/gpu2.token");
  EXPECT_EQ(global.tls_cert, "/etc/t/c.pem");
  EXPECT_EQ(global.tls_server_name, "node2.example");

  // --addr still wins over the named context's address; its credentials come along, as asked.
  GlobalOptions both;
  both.context = "gpu2";
  both.address = "tunnel:9000";
  both.address_given = true;
  ASSERT_TRUE(ApplyContext(TwoNodes(), path_, both).ok());
  EXPECT_EQ(both.address, "tunnel:9000");
  EXPECT_EQ(both.token_file, "/etc/t/gpu2.token");
}

TEST_F(ContextsTest, AnUnknownContextIsNotFoundNamingTheFile) {
  GlobalOptions global;
  global.context = "gpu9";
  const absl::Status status = ApplyContext(TwoNodes(), path_, global);
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(status.message(), HasSubstr("no context 'gpu9' in " + path_));

  ClientConfig dangling = TwoNodes();
  dangling.current_context = "gone";
  GlobalOptions plain;
  EXPECT_EQ(ApplyContext(dangling, path_, plain).code(), absl::StatusCode::kNotFound);
}

TEST_F(ContextsTest, NoContextsLeaveTheOptionsAlone) {
  GlobalOptions global;
  ASSERT_TRUE(ApplyContext(ClientConfig{}, path_, global).ok());
  EXPECT_EQ(global.address, std::string(kDefaultAddress));
  EXPECT_EQ(global.token_file, "");
}

}  // namespace
}  // namespace trainerd::client

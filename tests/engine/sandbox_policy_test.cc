// Tests for what the daemon requires of the sandbox of a process that runs submitted code
// (server/engine/torchscript/sandbox_policy.h): which parts are required, the refusal and the fix
// it names, what an operator may accept by name, and the daemon's own reading of a process from
// outside, which can take back what the process claimed but never add to it.
#include "server/engine/torchscript/sandbox_policy.h"

#include <seccomp.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainerd::engine {
namespace {

using ::testing::HasSubstr;

SandboxReport Whole() {
  SandboxReport r;
  r.program = "trainerd-worker";
  r.landlock_abi = 7;
  r.landlock = true;
  r.seccomp = true;
  r.no_new_privileges = true;
  r.not_dumpable = true;
  r.network_namespace = true;
  r.uid = 65534;
  return r;
}

TEST(SandboxPolicyTest, TheWholeSandboxPassesAndTheShownPartsAreNotRequired) {
  EXPECT_TRUE(CheckSandbox(Whole(), {}).ok());
  SandboxReport r = Whole();
  r.network_namespace = false;
  r.network_error = "EPERM";
  r.other_user = false;
  EXPECT_TRUE(CheckSandbox(r, {}).ok()) << "the network namespace and the user are shown only";
  EXPECT_THAT(RequiredSandboxParts(),
              ::testing::ElementsAre("landlock", "seccomp", "no_new_privileges", "not_dumpable"));
}

TEST(SandboxPolicyTest, AFilterAboveTheDaemonIsRefusedWithTheUnitsFix) {
  SandboxReport r = Whole();
  r.landlock = false;
  r.landlock_abi = 0;
  r.landlock_error = "EPERM";
  r.seccomp = false;
  r.seccomp_error = "EPERM";
  const absl::Status refused = CheckSandbox(r, {});
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.message(), HasSubstr("the sandbox of trainerd-worker lacks landlock"));
  EXPECT_THAT(refused.message(), HasSubstr("SystemCallFilter= must allow landlock_create_ruleset"));
  EXPECT_THAT(refused.message(), HasSubstr("; seccomp: a seccomp filter on the daemon refuses "
                                           "seccomp(2)"));
  EXPECT_THAT(refused.message(), HasSubstr("--worker_sandbox_may_lack=landlock,seccomp"));
  std::vector<SandboxShortfall> shortfalls = SandboxShortfalls(r, {});
  ASSERT_EQ(shortfalls.size(), 2u);
  EXPECT_EQ(shortfalls[0].part, "landlock");
  EXPECT_EQ(shortfalls[1].part, "seccomp");
}

TEST(SandboxPolicyTest, EachKernelReasonGetsItsOwnFix) {
  SandboxReport r = Whole();
  r.landlock = false;
  r.landlock_error = "ENOSYS";
  EXPECT_THAT(CheckSandbox(r, {}).message(), HasSubstr("Linux 5.13 or later"));
  r.landlock_error = "EOPNOTSUPP";
  EXPECT_THAT(CheckSandbox(r, {}).message(), HasSubstr("lsm= kernel boot parameter"));
  r.landlock_error = "probe";
  EXPECT_THAT(CheckSandbox(r, {}).message(), HasSubstr("a read outside them succeeded"));
  r = Whole();
  r.not_dumpable = false;
  EXPECT_THAT(CheckSandbox(r, {}).message(), HasSubstr("lacks not_dumpable"));
  r = Whole();
  r.no_new_privileges = false;
  EXPECT_THAT(CheckSandbox(r, {}).message(), HasSubstr("lacks no_new_privileges"));
}

TEST(SandboxPolicyTest, AnOperatorAcceptsOnlyThePartsItNames) {
  SandboxReport r = Whole();
  r.landlock = false;
  r.landlock_error = "EPERM";
  r.seccomp = false;
  r.seccomp_error = "EPERM";
  SandboxPolicy policy;
  policy.may_lack = {"landlock"};
  const absl::Status still = CheckSandbox(r, policy);
  EXPECT_FALSE(still.ok());
  EXPECT_THAT(still.message(), ::testing::Not(HasSubstr("lacks landlock")));
  EXPECT_THAT(still.message(), HasSubstr("lacks seccomp"));
  policy.may_lack = {"landlock", "seccomp"};
  EXPECT_TRUE(CheckSandbox(r, policy).ok());
}

// A child that claims everything: the daemon's reading of its status takes back what it lacks.
TEST(SandboxPolicyTest, WhatTheDaemonReadsFromOutsideTakesBackFalseClaims) {
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t plain = fork();
  if (plain == 0) {
    close(ready[0]);
    (void)!write(ready[1], "x", 1);
    pause();
    _exit(0);
  }
  char byte;
  ASSERT_EQ(read(ready[0], &byte, 1), 1);
  SandboxPolicy policy;
  policy.daemon_uid = getuid();
  SandboxReport claimed = Whole();
  MeasureFromOutside(plain, policy, &claimed);
  EXPECT_FALSE(claimed.seccomp) << "no filter of its own";
  EXPECT_EQ(claimed.seccomp_error, "probe");
  EXPECT_FALSE(claimed.no_new_privileges);
  EXPECT_EQ(claimed.uid, static_cast<int64_t>(getuid()));
  EXPECT_FALSE(claimed.other_user);
  kill(plain, SIGKILL);
  waitpid(plain, nullptr, 0);

  const pid_t filtered = fork();
  if (filtered == 0) {
    close(ready[0]);
    prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
    scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ALLOW);
    seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(ptrace), 0);
    if (seccomp_load(ctx) != 0) _exit(3);
    (void)!write(ready[1], "x", 1);
    pause();
    _exit(0);
  }
  ASSERT_EQ(read(ready[0], &byte, 1), 1);
  SandboxReport confined = Whole();
  policy.daemon_uid = getuid() + 1;  // as if the daemon were another user
  MeasureFromOutside(filtered, policy, &confined);
  EXPECT_TRUE(confined.seccomp);
  EXPECT_TRUE(confined.no_new_privileges);
  EXPECT_TRUE(confined.other_user);
  kill(filtered, SIGKILL);
  waitpid(filtered, nullptr, 0);
  close(ready[0]);
  close(ready[1]);
}

TEST(SandboxPolicyTest, TheDescriptionNamesEveryPartAndWhyOneIsMissing) {
  SandboxReport r = Whole();
  r.other_user = true;
  EXPECT_EQ(DescribeSandbox(r),
            "Landlock ABI 7, seccomp, no new privileges, not dumpable, network namespace, user "
            "65534 (not the daemon's)");
  r.landlock = false;
  r.landlock_error = "EPERM";
  r.network_namespace = false;
  r.network_error = "EPERM";
  EXPECT_THAT(DescribeSandbox(r), HasSubstr("no Landlock (EPERM)"));
  EXPECT_THAT(DescribeSandbox(r), HasSubstr("no network namespace (EPERM)"));
}

}  // namespace
}  // namespace trainerd::engine

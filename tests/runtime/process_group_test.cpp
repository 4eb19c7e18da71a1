// Launcher environments and the file bootstrap of `mhcrun --gpus N`: what a
// rank reads from its environment, and that rank 0's bytes reach the others
// (real processes, as mhcrun starts them) or time out with a message.
#include "runtime/dist/ProcessGroup.h"

#include <gtest/gtest.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <thread>
#include <cstdlib>
#include <sstream>
#include <fstream>
#include <sys/wait.h>
#include <unistd.h>

namespace mhcc::runtime {
namespace {

class Env {
public:
  explicit Env(std::vector<std::pair<std::string, std::string>> vars) : vars_(std::move(vars)) {
    for (auto &[k, v] : vars_)
      setenv(k.c_str(), v.c_str(), 1);
  }
  ~Env() {
    for (auto &[k, v] : vars_)
      unsetenv(k.c_str());
  }

private:
  std::vector<std::pair<std::string, std::string>> vars_;
};

TEST(ProcessGroup, NoLauncherMeansOneProcess) {
  std::string error;
  EXPECT_FALSE(detectPlacement(error));
  EXPECT_EQ(error, "");
  Env slurm({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}});
  EXPECT_FALSE(detectPlacement(error)) << "a one-task Slurm job is not a multi-process run";
  EXPECT_EQ(error, "");
}

TEST(ProcessGroup, ReadsEachLauncher) {
  std::string error;
  {
    Env env({{"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "4"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}});
    auto p = detectPlacement(error);
    ASSERT_TRUE(p) << error;
    EXPECT_EQ(p->rank, 3);
    EXPECT_EQ(p->size, 4);
    EXPECT_EQ(p->localRank, 1);
    EXPECT_EQ(p->launcher, "mpirun");
  }
  {
    Env env({{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "1"}});
    auto p = detectPlacement(error);
    ASSERT_TRUE(p) << error;
    EXPECT_EQ(p->rank, 5);
    EXPECT_EQ(p->localRank, 1);
    EXPECT_EQ(p->launcher, "srun");
  }
  {
    // mhcrun's own variables win over an enclosing launcher's.
    Env env({{"MHCC_RANK", "1"}, {"MHCC_WORLD_SIZE", "2"}, {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}});
    auto p = detectPlacement(error);
    ASSERT_TRUE(p) << error;
    EXPECT_EQ(p->launcher, "mhcrun --gpus");
    EXPECT_EQ(p->localRank, 1) << "no local rank given: the rank";
  }
}

TEST(ProcessGroup, RejectsMalformedEnvironments) {
  std::string error;
  {
    Env env({{"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_SIZE", "2"}});
    EXPECT_FALSE(detectPlacement(error));
    EXPECT_NE(error.find("rank 2 of 2"), std::string::npos) << error;
  }
  error.clear();
  {
    Env env({{"SLURM_PROCID", "-1"}, {"SLURM_NTASKS", "2"}});
    EXPECT_FALSE(detectPlacement(error));
    EXPECT_NE(error.find("SLURM_PROCID='-1'"), std::string::npos) << error;
  }
}

TEST(ProcessGroup, PicksOneGpuPerLocalRank) {
  std::string error;
  EXPECT_EQ(deviceForRank({5, 8, 1, "srun"}, 2, error), 1);
  EXPECT_EQ(deviceForRank({5, 8, 1, "srun"}, 1, error), 0) << "one visible GPU per process";
  EXPECT_EQ(deviceForRank({3, 4, 3, "mpirun"}, 2, error), -1);
  EXPECT_NE(error.find("only 2 GPU(s) are visible"), std::string::npos) << error;
}

TEST(ProcessGroup, FileBootstrapReachesEveryRankAcrossProcesses) {
  char dirTemplate[] = "/tmp/mhcc_bootstrap_test.XXXXXX";
  ASSERT_TRUE(mkdtemp(dirTemplate));
  Env env({{"MHCC_BOOTSTRAP_DIR", dirTemplate}});
  const int ranks = 3;
  std::vector<pid_t> children;
  for (int r = 1; r < ranks; ++r) {
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      std::string error;
      auto bootstrap = makeBootstrap({r, ranks, r, "mhcrun --gpus"}, 20, error);
      std::string first, second;
      bool ok = bootstrap && bootstrap->broadcast(first, error) && bootstrap->broadcast(second, error);
      // Exit status 0 only when both rounds carried rank 0's bytes.
      _exit(ok && first == std::string("ids\0of\0rank 0", 13) && second == "round two" ? 0 : 1);
    }
    children.push_back(pid);
  }
  std::string error;
  auto bootstrap = makeBootstrap({0, ranks, 0, "mhcrun --gpus"}, 20, error);
  ASSERT_TRUE(bootstrap) << error;
  std::string first("ids\0of\0rank 0", 13), second = "round two";
  ASSERT_TRUE(bootstrap->broadcast(first, error)) << error;
  ASSERT_TRUE(bootstrap->broadcast(second, error)) << error;
  for (pid_t pid : children) {
    int status = 0;
    waitpid(pid, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "a rank did not receive rank 0's bytes";
  }
  std::system(("rm -rf " + std::string(dirTemplate)).c_str());
}

TEST(ProcessGroup, FileBootstrapTimesOutWithAMessage) {
  char dirTemplate[] = "/tmp/mhcc_bootstrap_test.XXXXXX";
  ASSERT_TRUE(mkdtemp(dirTemplate));
  Env env({{"MHCC_BOOTSTRAP_DIR", dirTemplate}});
  std::string error, bytes;
  auto bootstrap = makeBootstrap({1, 2, 1, "mhcrun --gpus"}, 0.2, error);
  ASSERT_TRUE(bootstrap) << error;
  EXPECT_FALSE(bootstrap->broadcast(bytes, error));
  EXPECT_NE(error.find("rank 0 did not publish"), std::string::npos) << error;
  std::system(("rm -rf " + std::string(dirTemplate)).c_str());
}

TEST(ProcessGroup, MpiWithoutThePluginIsAClearError) {
  // The test binary has no libmhcc_mpi.so beside it.
  std::string error;
  auto bootstrap = makeBootstrap({0, 2, 0, "mpirun"}, 1, error);
  EXPECT_FALSE(bootstrap);
  EXPECT_NE(error.find("libmhcc_mpi.so cannot be loaded"), std::string::npos) << error;
}

TEST(ProcessGroup, LauncherGivesEachRankItsPlace) {
  // Every rank checks its own environment; all must exit 0.
  char program[] = "/bin/sh";
  char flag[] = "-c";
  char script[] = "[ \"$MHCC_WORLD_SIZE\" = 3 ] && [ \"$MHCC_RANK\" = \"$MHCC_LOCAL_RANK\" ] && [ -d \"$MHCC_BOOTSTRAP_DIR\" ]";
  char *argv[] = {program, flag, script, nullptr};
  std::ostringstream log;
  EXPECT_EQ(launchRanks(3, "/bin/sh", argv, log), 0) << log.str();
}

TEST(ProcessGroup, LauncherStopsTheOtherRanksWhenOneFails) {
  // Rank 1 fails at once; ranks 0 and 2 would wait a minute for it.
  char program[] = "/bin/sh";
  char flag[] = "-c";
  char script[] = "if [ \"$MHCC_RANK\" = 1 ]; then exit 3; fi; exec sleep 60";
  char *argv[] = {program, flag, script, nullptr};
  std::ostringstream log;
  auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(launchRanks(3, "/bin/sh", argv, log), 3);
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(seconds, 30) << "the waiting ranks were not stopped";
  EXPECT_NE(log.str().find("rank 1 exited with status 3; stopping the other ranks"), std::string::npos) << log.str();
}

TEST(ProcessGroup, LauncherKillsARankThatOutlivesAFailure) {
  // Rank 1 fails; rank 0 ignores SIGTERM (as a stuck rank, or one that only
  // stops at its next iteration, would): it must be SIGKILLed, not waited for.
  char program[] = "/bin/sh";
  char flag[] = "-c";
  char script[] = "if [ \"$MHCC_RANK\" = 1 ]; then sleep 0.2; exit 3; fi; trap '' TERM; exec sleep 60";
  char *argv[] = {program, flag, script, nullptr};
  std::ostringstream log;
  auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(launchRanks(2, "/bin/sh", argv, log), 3) << log.str();
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(seconds, 20) << "a rank that ignored SIGTERM after a failure was waited for";
  EXPECT_GT(seconds, 9) << "the surviving rank was killed without its grace period";
}

TEST(ProcessGroup, RanksGetSigtermWhenTheParentIsKilled) {
  // A launcher killed with SIGKILL cannot forward anything; its ranks must
  // still be told (PR_SET_PDEATHSIG) rather than run on as orphans.
  const char *tmp = std::getenv("TEST_TMPDIR");
  const std::string base = std::string(tmp ? tmp : "/tmp") + "/orphan";
  const std::string body = "trap 'kill $!; echo stopped > " + base + ".$MHCC_RANK.term; exit 0' TERM; echo $MHCC_BOOTSTRAP_DIR > " +
                           base + ".$MHCC_RANK; sleep 60 & wait";
  pid_t launcher = fork();
  ASSERT_GE(launcher, 0);
  if (launcher == 0) {
    std::vector<char> script(body.begin(), body.end());
    script.push_back('\0');
    char program[] = "/bin/sh";
    char flag[] = "-c";
    char *argv[] = {program, flag, script.data(), nullptr};
    std::ostringstream log;
    _exit(launchRanks(2, "/bin/sh", argv, log));
  }
  for (int r = 0; r < 2; ++r)
    for (int k = 0; k < 200 && !std::filesystem::exists(base + "." + std::to_string(r)); ++k)
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
  std::this_thread::sleep_for(std::chrono::milliseconds(200)); // the traps are set
  kill(launcher, SIGKILL);
  waitpid(launcher, nullptr, 0);
  for (int r = 0; r < 2; ++r) {
    const std::string term = base + "." + std::to_string(r) + ".term";
    for (int k = 0; k < 200 && !std::filesystem::exists(term); ++k)
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
    EXPECT_TRUE(std::filesystem::exists(term)) << "rank " << r << " got no SIGTERM when its launcher died";
  }
  // The killed launcher could not remove its folder; the test does.
  std::ifstream in(base + ".0");
  std::string dir;
  if (in >> dir && dir.rfind("/tmp/mhcrun.", 0) == 0)
    std::filesystem::remove_all(dir);
}

TEST(ProcessGroup, LauncherForwardsSigtermAndRemovesItsFolder) {
  // Every rank records its pid and bootstrap folder, then sleeps a minute;
  // SIGTERM to the parent must stop them all at once.
  const char *tmp = std::getenv("TEST_TMPDIR");
  const std::string base = std::string(tmp ? tmp : "/tmp") + "/forward";
  const std::string body = "echo \"$$ $MHCC_BOOTSTRAP_DIR\" > " + base + ".$MHCC_RANK; exec sleep 60";
  std::vector<char> script(body.begin(), body.end());
  script.push_back('\0');
  char program[] = "/bin/sh";
  char flag[] = "-c";
  char *argv[] = {program, flag, script.data(), nullptr};
  std::ostringstream log;
  std::thread stopper([] {
    std::this_thread::sleep_for(std::chrono::seconds(1));
    kill(getpid(), SIGTERM);
  });
  auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(launchRanks(2, "/bin/sh", argv, log), 128 + SIGTERM) << log.str();
  stopper.join();
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(seconds, 10) << "the ranks were not stopped";
  EXPECT_NE(log.str().find("got signal 15; stopping every rank"), std::string::npos) << log.str();
  for (int r = 0; r < 2; ++r) {
    std::ifstream in(base + "." + std::to_string(r));
    pid_t pid = 0;
    std::string dir;
    ASSERT_TRUE(in >> pid >> dir) << "rank " << r << " did not start";
    EXPECT_NE(kill(pid, 0), 0) << "rank " << r << " (pid " << pid << ") is still running";
    EXPECT_FALSE(std::filesystem::exists(dir)) << dir;
  }
}

} // namespace
} // namespace mhcc::runtime

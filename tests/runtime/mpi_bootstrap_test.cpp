// The mpirun path of the rank bootstrap, for real: the test starts itself
// under `mpirun -np 3`; each child finds its place from Open MPI's
// environment, loads libmhcc_mpi.so and receives rank 0's bytes (twice, so
// sizes and contents both travel). Skips where mpirun is not installed.
#include "runtime/dist/ProcessGroup.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <unistd.h>

namespace mhcc::runtime {
namespace {

const char *const kChildFlag = "--mpi-bootstrap-child";

/// Child mode: exit 0 when both broadcasts carried rank 0's bytes.
int child() {
  std::string error;
  std::optional<ProcessPlacement> placement = detectPlacement(error);
  if (!placement || placement->launcher != "mpirun" || placement->size != 3) {
    std::fprintf(stderr, "child: no mpirun placement (%s)\n", error.c_str());
    return 1;
  }
  std::unique_ptr<Bootstrap> bootstrap = makeBootstrap(*placement, 30, error);
  if (!bootstrap) {
    std::fprintf(stderr, "child: %s\n", error.c_str());
    return 1;
  }
  const std::string first("ncclUniqueId\0bytes", 18), second(300000, 'x');
  std::string a = placement->rank == 0 ? first : "", b = placement->rank == 0 ? second : "junk";
  if (!bootstrap->broadcast(a, error) || !bootstrap->broadcast(b, error)) {
    std::fprintf(stderr, "child %lld: %s\n", (long long)placement->rank, error.c_str());
    return 1;
  }
  return a == first && b == second ? 0 : 2;
}

TEST(MpiBootstrap, RankZeroBytesReachEveryRankUnderMpirun) {
  if (std::system("command -v mpirun > /dev/null 2>&1") != 0)
    GTEST_SKIP() << "mpirun is not installed";
  const char *plugin = std::getenv("MHCC_MPI_PLUGIN");
  ASSERT_NE(plugin, nullptr);
  std::string dir(plugin);
  dir = dir.substr(0, dir.rfind('/'));
  char self[4096];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  ASSERT_GT(n, 0);
  self[n] = '\0';
  std::string command = "LD_LIBRARY_PATH=" + dir + " timeout 120 mpirun --allow-run-as-root --oversubscribe "
                        "-np 3 -x LD_LIBRARY_PATH " + std::string(self) + " " + kChildFlag + " 2>&1";
  int status = std::system(command.c_str());
  EXPECT_EQ(status, 0) << "command: " << command;
}

} // namespace
} // namespace mhcc::runtime

int main(int argc, char **argv) {
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], mhcc::runtime::kChildFlag) == 0)
      return mhcc::runtime::child();
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}

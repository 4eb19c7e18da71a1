//===- ProcessGroup.cpp - launcher environments and rank-0 broadcast ----------===//
#include "runtime/dist/ProcessGroup.h"

#include <algorithm>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <vector>
#include <cstdio>
#include <cerrno>
#include <cstdlib>
#include <dlfcn.h>
#include <fstream>
#include <sstream>
#include <thread>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

namespace mhcc::runtime {
namespace {

std::optional<int64_t> integerEnv(const char *name, std::string &error) {
  const char *value = std::getenv(name);
  if (!value)
    return std::nullopt;
  char *end = nullptr;
  long long parsed = std::strtoll(value, &end, 10);
  if (end == value || *end != '\0' || parsed < 0) {
    error = std::string("the environment variable ") + name + "='" + value + "' is not a non-negative integer";
    return std::nullopt;
  }
  return parsed;
}

/// Rank 0 writes a file, the others wait for it: enough on one host, where
/// `mhcrun --gpus N` created the directory for this run alone.
class FileBootstrap : public Bootstrap {
public:
  FileBootstrap(ProcessPlacement placement, std::string dir, double timeout)
      : placement_(std::move(placement)), dir_(std::move(dir)), timeout_(timeout) {}

  bool broadcast(std::string &bytes, std::string &error) override {
    std::string path = dir_ + "/broadcast." + std::to_string(round_++);
    if (placement_.rank == 0) {
      std::string partial = path + ".partial";
      {
        std::ofstream out(partial, std::ios::binary | std::ios::trunc);
        out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
        if (!out) {
          error = "bootstrap: cannot write " + partial;
          return false;
        }
      }
      if (std::rename(partial.c_str(), path.c_str()) != 0) {
        error = "bootstrap: cannot rename " + partial;
        return false;
      }
      return true;
    }
    auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_);
    while (access(path.c_str(), R_OK) != 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        error = "bootstrap: rank 0 did not publish " + path + " within " + std::to_string(int(timeout_)) +
                " s (did rank 0 fail? its message comes first)";
        return false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    std::ifstream in(path, std::ios::binary);
    std::ostringstream content;
    content << in.rdbuf();
    bytes = content.str();
    return true;
  }

private:
  ProcessPlacement placement_;
  std::string dir_;
  double timeout_;
  int round_ = 0;
};

/// MPI_Bcast through libmhcc_mpi.so (see MpiPlugin.cpp), loaded on demand.
class MpiBootstrap : public Bootstrap {
public:
  using BroadcastFn = int (*)(char *, long, long *, char *, int);
  using FinalizeFn = void (*)();
  using AbortFn = void (*)(int);

  static std::unique_ptr<MpiBootstrap> load(const std::string &launcher, std::string &error) {
    std::string path = "libmhcc_mpi.so";
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n > 0) {
      self[n] = '\0';
      std::string exe(self);
      path = exe.substr(0, exe.rfind('/') + 1) + "libmhcc_mpi.so";
    }
    // Beside the binary first, then the library path (LD_LIBRARY_PATH).
    void *handle = dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL);
    std::string besideBinary = handle ? "" : dlerror();
    if (!handle)
      handle = dlopen("libmhcc_mpi.so", RTLD_NOW | RTLD_GLOBAL);
    if (!handle) {
      error = "started by " + launcher + ", which needs MPI to connect the ranks, but " + path +
              " cannot be loaded (" + besideBinary +
              "); keep libmhcc_mpi.so beside mhcrun, install Open MPI (libmpi.so.40), or start the ranks "
              "with 'mhcrun --gpus N' on one host";
      return nullptr;
    }
    auto broadcast = reinterpret_cast<BroadcastFn>(dlsym(handle, "mhcc_mpi_broadcast"));
    auto finalize = reinterpret_cast<FinalizeFn>(dlsym(handle, "mhcc_mpi_finalize"));
    auto abort = reinterpret_cast<AbortFn>(dlsym(handle, "mhcc_mpi_abort"));
    if (!broadcast || !finalize || !abort) {
      error = path + " lacks mhcc_mpi_broadcast / mhcc_mpi_finalize / mhcc_mpi_abort; rebuild it with this mhcrun";
      return nullptr;
    }
    auto b = std::unique_ptr<MpiBootstrap>(new MpiBootstrap());
    b->broadcast_ = broadcast;
    b->finalize_ = finalize;
    b->abort_ = abort;
    return b;
  }
  ~MpiBootstrap() override { finalize_(); }
  void abortRun() override { abort_(1); }

  bool broadcast(std::string &bytes, std::string &error) override {
    // Sizes first, then the bytes, in one call of the plugin.
    std::string buffer = bytes;
    buffer.resize(1 << 20);
    long size = static_cast<long>(bytes.size());
    char message[512] = {0};
    if (broadcast_(buffer.data(), static_cast<long>(buffer.size()), &size, message, sizeof message) != 0) {
      error = std::string("MPI bootstrap: ") + message;
      return false;
    }
    bytes.assign(buffer.data(), static_cast<size_t>(size));
    return true;
  }

private:
  MpiBootstrap() = default;
  BroadcastFn broadcast_ = nullptr;
  FinalizeFn finalize_ = nullptr;
  AbortFn abort_ = nullptr;
};

} // namespace

std::optional<ProcessPlacement> detectPlacement(std::string &error) {
  struct Source {
    const char *rank, *size, *local, *launcher;
  };
  const Source sources[] = {
      {"MHCC_RANK", "MHCC_WORLD_SIZE", "MHCC_LOCAL_RANK", "mhcrun --gpus"},
      {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "mpirun"},
      {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "srun"},
  };
  for (const Source &source : sources) {
    std::optional<int64_t> rank = integerEnv(source.rank, error), size = integerEnv(source.size, error);
    std::optional<int64_t> local = integerEnv(source.local, error);
    if (!error.empty())
      return std::nullopt;
    if (!rank || !size)
      continue;
    // A Slurm allocation running one task is not a multi-process run.
    if (*size <= 1 && std::string(source.launcher) == "srun")
      continue;
    if (*rank >= *size) {
      error = std::string(source.launcher) + " says rank " + std::to_string(*rank) + " of " + std::to_string(*size) +
              " (" + source.rank + ", " + source.size + "): not a valid rank";
      return std::nullopt;
    }
    return ProcessPlacement{*rank, *size, local.value_or(*rank), source.launcher};
  }
  return std::nullopt;
}

std::unique_ptr<Bootstrap> makeBootstrap(const ProcessPlacement &placement, double timeoutSeconds,
                                         std::string &error) {
  if (placement.launcher == "mhcrun --gpus") {
    const char *dir = std::getenv("MHCC_BOOTSTRAP_DIR");
    if (!dir) {
      error = "MHCC_RANK is set but MHCC_BOOTSTRAP_DIR is not: ranks are started by 'mhcrun --gpus N', not by hand";
      return nullptr;
    }
    return std::make_unique<FileBootstrap>(placement, dir, timeoutSeconds);
  }
  return MpiBootstrap::load(placement.launcher, error);
}

namespace {
/// The stop signal (SIGTERM / SIGINT) the --gpus parent received, if any.
volatile sig_atomic_t gStopSignal = 0;
extern "C" void recordStopSignal(int signal) { gStopSignal = signal; }

/// Installs recordStopSignal for SIGTERM and SIGINT while alive; restores
/// the previous handlers after, so a caller (a test) is left as it was.
class StopSignals {
public:
  StopSignals() {
    gStopSignal = 0;
    struct sigaction action = {};
    action.sa_handler = recordStopSignal;
    sigemptyset(&action.sa_mask);
    sigaction(SIGTERM, &action, &oldTerm_);
    sigaction(SIGINT, &action, &oldInt_);
  }
  ~StopSignals() {
    sigaction(SIGTERM, &oldTerm_, nullptr);
    sigaction(SIGINT, &oldInt_, nullptr);
  }

private:
  struct sigaction oldTerm_ = {}, oldInt_ = {};
};

/// How long stopped ranks get to exit before they are killed: a signal's
/// stop lets them finish the iteration and save; after a rank failed there
/// is nothing left to finish (a step needs every rank), and a stuck rank,
/// or one that treats SIGTERM as "stop at the next iteration", would
/// otherwise be waited for forever.
constexpr auto kStopGrace = std::chrono::seconds(30);
constexpr auto kFailureGrace = std::chrono::seconds(10);
} // namespace

int launchRanks(int64_t ranks, const std::string &program, char **argv, std::ostream &log) {
  char dirTemplate[] = "/tmp/mhcrun.XXXXXX";
  if (!mkdtemp(dirTemplate)) {
    log << "mhcrun: --gpus: cannot create a bootstrap directory under /tmp\n";
    return 1;
  }
  const std::string dir = dirTemplate;
  std::error_code ignored;
  // Before the first fork: a signal from now on is forwarded, never lost.
  StopSignals signals;
  std::vector<pid_t> children;
  const pid_t parent = getpid();
  for (int64_t r = 0; r < ranks; ++r) {
    pid_t pid = fork();
    if (pid < 0) {
      for (pid_t child : children)
        kill(child, SIGKILL);
      for (pid_t child : children)
        waitpid(child, nullptr, 0);
      std::filesystem::remove_all(dir, ignored);
      log << "mhcrun: --gpus: cannot start rank " << r << "\n";
      return 1;
    }
    if (pid == 0) {
      // A parent killed outright (SIGKILL, OOM) cannot forward anything: the
      // kernel then sends each rank SIGTERM, a stop at its next iteration.
      prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (getppid() != parent)
        _exit(1); // the parent died before prctl
      signal(SIGTERM, SIG_DFL); // exec keeps neither handler, but a failed exec must not linger
      signal(SIGINT, SIG_DFL);
      setenv("MHCC_RANK", std::to_string(r).c_str(), 1);
      setenv("MHCC_WORLD_SIZE", std::to_string(ranks).c_str(), 1);
      setenv("MHCC_LOCAL_RANK", std::to_string(r).c_str(), 1);
      setenv("MHCC_BOOTSTRAP_DIR", dir.c_str(), 1);
      execv(program.c_str(), argv);
      std::perror("mhcrun: exec");
      _exit(127);
    }
    children.push_back(pid);
  }
  int result = 0;
  std::vector<char> exited(children.size(), 0);
  auto stopOthers = [&](int signal) {
    for (size_t k = 0; k < children.size(); ++k)
      if (!exited[k])
        kill(children[k], signal);
  };
  int forwarded = 0;
  auto stopDeadline = std::chrono::steady_clock::time_point::max(); // then SIGKILL
  // Polls rather than blocking in wait(): a signal arriving just before a
  // blocking wait would otherwise go unforwarded until a rank exits.
  for (size_t running = children.size(); running > 0;) {
    if (gStopSignal && !forwarded) {
      forwarded = gStopSignal;
      log << "mhcrun: --gpus: got signal " << forwarded << "; stopping every rank\n";
      stopOthers(forwarded);
      stopDeadline = std::chrono::steady_clock::now() + kStopGrace;
      if (result == 0)
        result = 128 + forwarded;
    } else if (std::chrono::steady_clock::now() > stopDeadline) {
      stopOthers(SIGKILL);
      stopDeadline = std::chrono::steady_clock::time_point::max();
    }
    int status = 0;
    pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      continue;
    }
    if (pid < 0) {
      if (errno == EINTR)
        continue;
      break;
    }
    size_t rank = std::find(children.begin(), children.end(), pid) - children.begin();
    if (rank == children.size())
      continue; // not one of ours
    exited[rank] = 1;
    --running;
    bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (!ok && result == 0) {
      result = WIFEXITED(status) ? WEXITSTATUS(status) : 1;
      // One string, one write: the ranks write to the same stderr.
      log << ("mhcrun: rank " + std::to_string(rank) + " " +
              (WIFSIGNALED(status) ? "was killed by signal " + std::to_string(WTERMSIG(status))
                                   : "exited with status " + std::to_string(WEXITSTATUS(status))) +
              "; stopping the other ranks\n")
          << std::flush;
      stopOthers(SIGTERM);
      stopDeadline = std::min(stopDeadline, std::chrono::steady_clock::now() + kFailureGrace);
    }
  }
  std::filesystem::remove_all(dir, ignored);
  return result;
}

int deviceForRank(const ProcessPlacement &placement, int visibleGpus, std::string &error) {
  if (visibleGpus == 1)
    return 0;
  if (placement.localRank < visibleGpus)
    return static_cast<int>(placement.localRank);
  error = "rank " + std::to_string(placement.rank) + " is local rank " + std::to_string(placement.localRank) +
          " on its host, but only " + std::to_string(visibleGpus) +
          " GPU(s) are visible there; start at most one rank per GPU on each host";
  return -1;
}

} // namespace mhcc::runtime

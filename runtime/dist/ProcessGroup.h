//===- ProcessGroup.h - one process per pipeline rank ---------------*- C++ -*-===//
//
// Where this process sits when a launcher started one process per GPU, and
// how rank 0 hands the others the bytes NCCL needs to connect (its unique
// ids). Three launchers are understood:
//
//   mhcrun --gpus N   MHCC_RANK, MHCC_WORLD_SIZE, MHCC_LOCAL_RANK and a
//                     private directory MHCC_BOOTSTRAP_DIR (file exchange)
//   mpirun (Open MPI) OMPI_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK; bytes
//                     through MPI_Bcast
//   srun (Slurm)      SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID; bytes
//                     through MPI_Bcast (srun --mpi=pmix)
//
// MPI is loaded only when a run needs it, from libmhcc_mpi.so next to the
// binary, so mhcrun starts on machines without MPI.
//
//===----------------------------------------------------------------------===//
#ifndef MHCC_RUNTIME_DIST_PROCESSGROUP_H
#define MHCC_RUNTIME_DIST_PROCESSGROUP_H

#include <cstdint>
#include <memory>
#include <optional>
#include <ostream>
#include <string>

namespace mhcc::runtime {

struct ProcessPlacement {
  int64_t rank = 0, size = 1, localRank = 0;
  std::string launcher; // "mhcrun --gpus", "mpirun" or "srun"
};

/// nullopt when this process was not started as one of several ranks. A
/// malformed launcher environment is an error (`error` set, nullopt).
std::optional<ProcessPlacement> detectPlacement(std::string &error);

class Bootstrap {
public:
  virtual ~Bootstrap() = default;
  /// Rank 0's `bytes` replace every other rank's; false and `error` (naming
  /// the launcher and the fix) on failure or after `timeoutSeconds`.
  virtual bool broadcast(std::string &bytes, std::string &error) = 0;
  /// This rank failed (its line printed): end every rank of the run.
  /// mpirun and srun would wait for the others, which may wait for this one
  /// in NCCL's initialization or a collective forever (MPI_Abort); under
  /// mhcrun's own launcher nothing, as it stops the others itself.
  virtual void abortRun() {}
};

std::unique_ptr<Bootstrap> makeBootstrap(const ProcessPlacement &placement, double timeoutSeconds,
                                         std::string &error);

/// `mhcrun --gpus N` on one host: starts `program` with `argv` once per
/// rank, each told its rank through MHCC_RANK, MHCC_WORLD_SIZE,
/// MHCC_LOCAL_RANK and a private MHCC_BOOTSTRAP_DIR, and waits. When a rank
/// fails, the others are stopped (SIGTERM, SIGKILL after 10 s), so no rank
/// is left waiting on a dead peer or stuck. SIGTERM or SIGINT to this
/// process is forwarded to every rank (SIGKILL after 30 s if one lingers:
/// time to finish the iteration and save) and gives 128 + the signal. The
/// bootstrap folder is removed in every case. Returns 0 when every rank
/// exited with 0; else reports the first failure on `log` and returns its
/// exit status (1 if signalled).
int launchRanks(int64_t ranks, const std::string &program, char **argv, std::ostream &log);

/// The GPU a rank uses: its local rank, or 0 when the launcher gave each
/// process exactly one visible GPU. -1 and `error` when there is none.
int deviceForRank(const ProcessPlacement &placement, int visibleGpus, std::string &error);

} // namespace mhcc::runtime

#endif // MHCC_RUNTIME_DIST_PROCESSGROUP_H

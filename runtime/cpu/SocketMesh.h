//===- SocketMesh.h - CPU ranks in several processes, one socket a pair -*- C++ -*-===//
//
// The CPU backend's channels between processes on one host: one Unix-domain
// stream socket per rank pair (each direction a FIFO, as NCCL matches one
// pair's messages in order), rendezvous through `rank<R>.sock` files in a
// folder the launcher gives (the --processes parent's bootstrap folder, or
// one rank 0 made and broadcast under mpirun / srun).
//
// A reader thread per peer drains its socket into a queue, so a send never
// waits for the peer's compute (sends "never block", as in the in-process
// channels) and a peer's death is seen at once: its socket reads EOF.
//
// A heartbeat thread tells every peer, about once a second, how long ago
// this rank last made progress (the device calls progressed() per
// instruction and exchange) and whom it waits on. A wait (a receive, or a
// send the peer does not drain) therefore ends in one of four ways, each
// named: a frame, the peer's connection closed (lost), a peer's report of
// its own failure, or the rank at the end of the chain of waits (the one
// that waits on nobody: the rank actually stuck, not its neighbour waiting
// on it) making no progress for the limit (stuck). A rank that stops
// heartbeating (SIGSTOP, a dead host thread) stops progressing, and ends
// the chain. A slow rank that progresses is never declared stuck, however
// long a wait on it lasts.
//
//===----------------------------------------------------------------------===//
#ifndef MHCC_RUNTIME_CPU_SOCKETMESH_H
#define MHCC_RUNTIME_CPU_SOCKETMESH_H

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace mhcc::runtime {

/// One message: a tag as the in-process channels have (kind, payload,
/// source and destination stage, microbatch) and raw bytes. A Collective
/// (a tensor- or context-parallel group's) carries the sender's count of
/// collectives in payload, so both ends check they are in the same one. A Heartbeat
/// carries the sender in src, its progress counter in dst, the microseconds
/// since its last progress in mb and the rank it waits on (-1: none) in
/// payload.
struct Frame {
  enum Kind : int32_t {
    Data = 1, Gather = 2, Reply = 3, Failure = 4, Heartbeat = 6, Reduce = 7, Collective = 8,
    Shard = 9, ShardWeights = 10 // the distributed optimizer's (CpuProcessDevice)
  };
  int32_t kind = Data, payload = 0;
  int64_t src = 0, dst = 0, mb = 0;
  std::vector<char> bytes;
};

class SocketMesh {
public:
  /// Connects this rank to every other one; nullptr and `error` when a peer
  /// does not appear within `connectSeconds`. `stuckSeconds` is how long a
  /// rank waited on may go without progress (--recv-timeout).
  static std::unique_ptr<SocketMesh> connect(int64_t rank, int64_t size, const std::string &dir,
                                             double connectSeconds, double stuckSeconds, std::string &error);
  ~SocketMesh();

  /// Writes `frame` to `peer`; waits only while the peer does not drain its
  /// socket (then as a receive waits: false and `error` when it is lost,
  /// stuck, a peer reported a failure, or abort() was called).
  bool send(int64_t peer, const Frame &frame, std::string &error);
  /// The next frame from `peer`; false and `error` naming the rank lost or
  /// stuck (or the report of a peer that failed, or the abort).
  bool receive(int64_t peer, Frame &frame, std::string &error);
  /// Ends every wait at once (another part of this process failed).
  void abort();
  /// Tells every peer this rank failed and why (`why` names the rank it
  /// lost): a peer waiting on anyone ends its wait with "rank R reported:
  /// why" instead of blaming the next rank in the chain or timing out.
  /// Best effort, at most a second per peer: a lost or stopped peer is skipped.
  void reportFailure(const std::string &why);

  /// This rank made progress (an instruction ran, an exchange completed).
  void progressed() { progress_.fetch_add(1, std::memory_order_relaxed); }
  /// While on, this rank counts as progressing as long as it heartbeats (up
  /// to kLocalWorkLimit at a stretch): work between steps that runs no
  /// instruction and waits on no peer (loading, saving, the optimizer on
  /// rank 0). A rank hung there is found when the stretch ends.
  void setLocalWork(bool on);
  /// The longest stretch of local work that counts as progress.
  static constexpr std::chrono::minutes kLocalWorkLimit{10};

private:
  using Clock = std::chrono::steady_clock;
  struct Peer {
    int fd = -1;
    std::thread reader;
    std::mutex mutex; // the queue and closed
    std::condition_variable ready;
    std::deque<Frame> queue;
    bool closed = false;
    std::mutex sendMutex; // one writer at a time: frames never interleave
  };
  /// What this rank knows of another from its heartbeats.
  struct Liveness {
    Clock::time_point lastProgress, lastHeartbeat;
    int64_t waitingOn = -1;
  };
  /// The rank a wait suspects of being stuck, and since when.
  struct Suspicion {
    int64_t rank = -1;
    Clock::time_point since;
  };
  SocketMesh(int64_t rank, int64_t size, double stuckSeconds);
  void readLoop(int64_t from);
  void heartbeatLoop();
  /// Why a wait on `peer` (`closed`: its connection is) must end now, or ""
  /// to keep waiting; `suspicion` carries a stuck verdict across the
  /// wait's looks, which must hold for three beats.
  std::string waitProblem(int64_t peer, bool closed, bool sending, Suspicion &suspicion);
  /// A wait that began at `start` ended.
  void endWait(Clock::time_point start);
  /// Follows the waits from `peer` to the rank at their end (stateMutex_ held).
  int64_t stuckRank(int64_t peer, Clock::time_point now);
  /// Writes to `peer` (rank `rank`; its sendMutex held), waiting while its
  /// socket is full until waitProblem or `deadline` ends the wait (then
  /// false and `error`); with `announce`, peers learn whom this rank waits on.
  bool write(Peer &peer, int64_t rank, const void *data, size_t size, Clock::time_point deadline, bool announce,
             std::string &error);

  int64_t rank_;
  std::vector<std::unique_ptr<Peer>> peers_; // null for this rank
  const std::chrono::duration<double> limit_; // --recv-timeout
  const std::chrono::microseconds beat_;      // heartbeat period: 1 s, less for a small limit
  std::atomic<bool> aborted_{false};
  std::atomic<bool> reported_{false}; // a peer's Failure frame arrived
  std::atomic<uint64_t> progress_{0};
  std::atomic<int64_t> localWorkSince_; // Clock ticks; -1: none
  std::atomic<int64_t> waitingOn_{-1}; // the peer this rank waits on now
  std::mutex stateMutex_;
  std::string report_;             // "rank R reported: ..."
  std::vector<Liveness> liveness_; // by rank, from their heartbeats
  std::thread heartbeat_;
  std::mutex heartbeatMutex_;
  std::condition_variable heartbeatWake_;
  bool stopping_ = false, nudged_ = false;
};

} // namespace mhcc::runtime

#endif // MHCC_RUNTIME_CPU_SOCKETMESH_H

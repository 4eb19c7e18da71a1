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
// channels) and a peer's death is seen at once: its socket reads EOF. A
// receive therefore ends in one of three ways, each named: a frame, the
// peer's connection closed (lost), or nothing within the deadline (stuck).
//
//===----------------------------------------------------------------------===//
#ifndef MHCC_RUNTIME_CPU_SOCKETMESH_H
#define MHCC_RUNTIME_CPU_SOCKETMESH_H

#include <atomic>
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
/// source and destination stage, microbatch) and raw bytes.
struct Frame {
  enum Kind : int32_t { Data = 1, Gather = 2, Reply = 3, Failure = 4, Waiting = 5 };
  int32_t kind = Data, payload = 0;
  int64_t src = 0, dst = 0, mb = 0;
  std::vector<char> bytes;
};

class SocketMesh {
public:
  /// Connects this rank to every other one; nullptr and `error` when a peer
  /// does not appear within `timeoutSeconds`.
  static std::unique_ptr<SocketMesh> connect(int64_t rank, int64_t size, const std::string &dir,
                                             double timeoutSeconds, std::string &error);
  ~SocketMesh();

  /// Writes `frame` to `peer` (waits only for socket space, at most the
  /// deadline given to connect).
  bool send(int64_t peer, const Frame &frame, std::string &error);
  /// The next frame from `peer`; false and `error` naming the peer when it
  /// is lost, sent nothing within `timeoutSeconds`, or abort() was called.
  bool receive(int64_t peer, Frame &frame, double timeoutSeconds, std::string &error);
  /// Ends every wait at once (another part of this process failed).
  void abort();
  /// Tells every peer this rank failed and why (`why` names the rank it
  /// lost): a peer waiting on anyone ends its wait with "rank R reported:
  /// why" instead of blaming the next rank in the chain or timing out.
  /// Best effort: a lost peer is skipped.
  void reportFailure(const std::string &why);

private:
  struct Peer {
    int fd = -1;
    std::thread reader;
    std::mutex mutex;
    std::condition_variable ready;
    std::deque<Frame> queue;
    bool closed = false;
  };
  SocketMesh(int64_t rank, int64_t size) : rank_(rank), peers_(size), waitingOn_(size, -1) {}
  void readLoop(Peer &peer);
  void announceWait(int64_t peer);
  int64_t stuckRank(int64_t peer);

  int64_t rank_;
  std::vector<std::unique_ptr<Peer>> peers_; // null for this rank
  std::atomic<bool> aborted_{false};
  std::atomic<bool> reported_{false}; // a peer's Failure frame arrived
  std::mutex reportMutex_;
  std::string report_; // "rank R reported: ..."
  // Who each rank has been waiting on for a while (-1: nobody), from their
  // Waiting frames: a timeout blames the end of the chain of waits, the
  // rank actually stuck, not the neighbour that waits on it.
  std::vector<int64_t> waitingOn_;
};

} // namespace mhcc::runtime

#endif // MHCC_RUNTIME_CPU_SOCKETMESH_H

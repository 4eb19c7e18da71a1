//===- SocketMesh.cpp - CPU ranks in several processes, one socket a pair ----===//
#include "runtime/cpu/SocketMesh.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <thread>
#include <unistd.h>

namespace mhcc::runtime {
namespace {

using Clock = std::chrono::steady_clock;
/// How often a waiting receive or send looks at the peers' state.
constexpr auto kWaitSlice = std::chrono::milliseconds(10);
/// The longest heartbeat period; a limit under 8 s beats 8 times per limit.
constexpr double kBeatSeconds = 1.0;

/// The fixed part of a frame on the wire (host byte order: one host).
struct WireHeader {
  int32_t kind, payload;
  int64_t src, dst, mb, bytes;
};

/// Blocking write while connecting (the rank number), before the threads run.
bool writeAll(int fd, const void *data, size_t size) {
  const char *p = static_cast<const char *>(data);
  while (size > 0) {
    ssize_t n = ::send(fd, p, size, MSG_NOSIGNAL); // a dead peer is an error, not SIGPIPE
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return false;
    p += n;
    size -= size_t(n);
  }
  return true;
}

bool readAll(int fd, void *data, size_t size) {
  char *p = static_cast<char *>(data);
  while (size > 0) {
    ssize_t n = ::read(fd, p, size);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return false;
    p += n;
    size -= size_t(n);
  }
  return true;
}

bool socketAddress(const std::string &path, sockaddr_un &address, std::string &error) {
  address = {};
  address.sun_family = AF_UNIX;
  if (path.size() >= sizeof address.sun_path) {
    error = "the socket path " + path + " is too long for a Unix socket; use a shorter TMPDIR";
    return false;
  }
  std::memcpy(address.sun_path, path.c_str(), path.size() + 1);
  return true;
}

std::string sockPath(const std::string &dir, int64_t rank) { return dir + "/rank" + std::to_string(rank) + ".sock"; }

/// "30", "0.5": a limit in seconds as the user gave it.
std::string seconds(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", value);
  return text;
}

} // namespace

SocketMesh::SocketMesh(int64_t rank, int64_t size, double stuckSeconds)
    : rank_(rank), peers_(size), limit_(stuckSeconds),
      beat_(int64_t(std::clamp(stuckSeconds / 8, 0.01, kBeatSeconds) * 1e6)),
      localWorkSince_(Clock::now().time_since_epoch().count()), liveness_(size) {}

std::unique_ptr<SocketMesh> SocketMesh::connect(int64_t rank, int64_t size, const std::string &dir,
                                               double connectSeconds, double stuckSeconds, std::string &error) {
  std::unique_ptr<SocketMesh> mesh(new SocketMesh(rank, size, stuckSeconds));
  const auto deadline = Clock::now() + std::chrono::duration<double>(connectSeconds);
  const std::string mine = sockPath(dir, rank);
  sockaddr_un address;
  // Listen before connecting to lower ranks: a higher rank's connect then
  // waits in the backlog, whatever order the processes start in.
  int listener = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (listener < 0 || !socketAddress(mine, address, error) ||
      ::bind(listener, reinterpret_cast<sockaddr *>(&address), sizeof address) != 0 || ::listen(listener, 64) != 0) {
    if (error.empty())
      error = "cannot listen on " + mine + ": " + std::strerror(errno);
    if (listener >= 0)
      ::close(listener);
    return nullptr;
  }
  auto fail = [&](const std::string &message) {
    error = message;
    ::close(listener);
    ::unlink(mine.c_str());
    return nullptr;
  };
  for (int64_t peer = 0; peer < rank; ++peer) {
    if (!socketAddress(sockPath(dir, peer), address, error))
      return fail(error); // a path too long never becomes valid: no retries
    int fd = -1;
    while (true) {
      fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (::connect(fd, reinterpret_cast<sockaddr *>(&address), sizeof address) == 0)
        break;
      ::close(fd);
      if (Clock::now() > deadline)
        return fail("rank " + std::to_string(peer) + " did not open " + sockPath(dir, peer) + " within " +
                    seconds(connectSeconds) + " s (did it fail to start? its message comes first)");
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    if (!writeAll(fd, &rank, sizeof rank))
      return fail("rank " + std::to_string(peer) + " closed its socket while connecting");
    mesh->peers_[peer] = std::make_unique<Peer>();
    mesh->peers_[peer]->fd = fd;
  }
  for (int64_t accepted = rank + 1; accepted < size; ++accepted) {
    pollfd waiting{listener, POLLIN, 0};
    int ready = 0;
    do { // a signal that does not end the process (mpirun forwards SIGCONT) is no timeout
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      const int ms = int(std::min<decltype(left)>(left, 1 << 30)); // --recv-timeout may exceed an int of ms
      ready = ms <= 0 ? 0 : ::poll(&waiting, 1, ms);
    } while (ready < 0 && errno == EINTR);
    if (ready <= 0)
      return fail("ranks above " + std::to_string(rank) + " did not all connect to " + mine + " within " +
                  seconds(connectSeconds) + " s");
    int fd = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
    int64_t peer = -1;
    if (fd < 0 || !readAll(fd, &peer, sizeof peer) || peer <= rank || peer >= size || mesh->peers_[peer])
      return fail("a connection to " + mine + " did not name a new higher rank (a stale process?)");
    mesh->peers_[peer] = std::make_unique<Peer>();
    mesh->peers_[peer]->fd = fd;
  }
  ::close(listener);
  ::unlink(mine.c_str()); // connected sockets outlive their file
  // Every rank counts as heard from and progressing now; then the threads.
  const auto now = Clock::now();
  for (Liveness &l : mesh->liveness_)
    l.lastProgress = l.lastHeartbeat = now;
  mesh->localWorkSince_ = now.time_since_epoch().count(); // until the first step begins
  for (size_t peer = 0; peer < mesh->peers_.size(); ++peer)
    if (mesh->peers_[peer])
      mesh->peers_[peer]->reader = std::thread([m = mesh.get(), peer] { m->readLoop(int64_t(peer)); });
  mesh->heartbeat_ = std::thread([m = mesh.get()] { m->heartbeatLoop(); });
  return mesh;
}

SocketMesh::~SocketMesh() {
  {
    std::lock_guard<std::mutex> lock(heartbeatMutex_);
    stopping_ = true;
  }
  heartbeatWake_.notify_all();
  if (heartbeat_.joinable())
    heartbeat_.join();
  for (auto &peer : peers_)
    if (peer) {
      ::shutdown(peer->fd, SHUT_RDWR); // ends the reader's read
      if (peer->reader.joinable())
        peer->reader.join();
      ::close(peer->fd);
    }
}

void SocketMesh::readLoop(int64_t from) {
  Peer &peer = *peers_[from];
  while (true) {
    WireHeader header;
    Frame frame;
    bool ok = readAll(peer.fd, &header, sizeof header) && header.bytes >= 0;
    if (ok) {
      frame.kind = header.kind;
      frame.payload = header.payload;
      frame.src = header.src;
      frame.dst = header.dst;
      frame.mb = header.mb;
      frame.bytes.resize(size_t(header.bytes));
      ok = readAll(peer.fd, frame.bytes.data(), frame.bytes.size());
    }
    if (ok && frame.kind == Frame::Heartbeat) {
      const auto now = Clock::now();
      std::lock_guard<std::mutex> lock(stateMutex_);
      Liveness &l = liveness_[from];
      l.lastHeartbeat = now;
      l.lastProgress = std::max(l.lastProgress, now - std::chrono::microseconds(std::max<int64_t>(0, frame.mb)));
      l.waitingOn = frame.payload;
      continue;
    }
    if (ok && frame.kind == Frame::Failure) {
      std::lock_guard<std::mutex> lock(stateMutex_);
      if (report_.empty())
        report_ = "rank " + std::to_string(from) + " reported: " + std::string(frame.bytes.begin(), frame.bytes.end());
      reported_ = true;
      continue;
    }
    if (ok) { // a message is progress too
      std::lock_guard<std::mutex> lock(stateMutex_);
      liveness_[from].lastProgress = Clock::now();
    }
    std::lock_guard<std::mutex> lock(peer.mutex);
    if (!ok) {
      peer.closed = true;
      peer.ready.notify_all();
      return;
    }
    peer.queue.push_back(std::move(frame));
    peer.ready.notify_all();
  }
}

/// Every beat: to each peer, how long ago this rank last progressed and whom
/// it waits on. The counter is sampled here, so a tick costs one atomic add;
/// the age is late by at most a beat (on the side of "progressing").
void SocketMesh::heartbeatLoop() {
  uint64_t seen = progress_.load(std::memory_order_relaxed);
  auto changed = Clock::now();
  std::unique_lock<std::mutex> lock(heartbeatMutex_);
  while (!stopping_) {
    lock.unlock();
    const auto now = Clock::now();
    const uint64_t count = progress_.load(std::memory_order_relaxed);
    if (count != seen) {
      seen = count;
      changed = now;
    }
    const int64_t since = localWorkSince_.load();
    if (since >= 0 && now - Clock::time_point(Clock::duration(since)) < kLocalWorkLimit)
      changed = now;
    const WireHeader header{Frame::Heartbeat, int32_t(waitingOn_.load()), rank_, int64_t(count),
                            std::chrono::duration_cast<std::chrono::microseconds>(now - changed).count(), 0};
    for (size_t other = 0; other < peers_.size(); ++other) {
      Peer *peer = peers_[other].get();
      // A peer's socket busy with a frame (or full: the peer is not reading)
      // misses this beat rather than stalling the beats to the others.
      if (!peer || !peer->sendMutex.try_lock())
        continue;
      std::lock_guard<std::mutex> sending(peer->sendMutex, std::adopt_lock);
      const ssize_t n = ::send(peer->fd, &header, sizeof header, MSG_DONTWAIT | MSG_NOSIGNAL);
      // Linux queues a small Unix stream write whole or not at all; should
      // one ever be split, the rest must follow, or the stream loses its frames.
      std::string ignored;
      if (n > 0 && size_t(n) < sizeof header)
        write(*peer, int64_t(other), reinterpret_cast<const char *>(&header) + n, sizeof header - size_t(n),
              Clock::now() + std::chrono::seconds(1), false, ignored);
    }
    lock.lock();
    heartbeatWake_.wait_for(lock, beat_, [this] { return stopping_ || nudged_; });
    nudged_ = false;
  }
}

void SocketMesh::setLocalWork(bool on) {
  if (!on) {
    localWorkSince_ = -1;
    return;
  }
  int64_t none = -1; // a stretch already under way keeps its start
  localWorkSince_.compare_exchange_strong(none, Clock::now().time_since_epoch().count());
}

bool SocketMesh::write(Peer &peer, int64_t rank, const void *data, size_t size, Clock::time_point deadline,
                       bool announce, std::string &error) {
  const char *p = static_cast<const char *>(data);
  const auto start = Clock::now();
  Suspicion suspicion;
  bool waiting = false;
  while (size > 0) {
    const ssize_t n = ::send(peer.fd, p, size, MSG_DONTWAIT | MSG_NOSIGNAL); // a dead peer: an error, no SIGPIPE
    if (n > 0) {
      p += n;
      size -= size_t(n);
      continue;
    }
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      // The socket is full: the peer's reader does not drain it. A wait
      // like a receive's, ended the same ways.
      if (announce && !waiting)
        waitingOn_ = rank;
      waiting = true;
      bool closed;
      {
        std::lock_guard<std::mutex> lock(peer.mutex);
        closed = peer.closed;
      }
      error = waitProblem(rank, closed, true, suspicion);
      if (error.empty() && Clock::now() > deadline)
        error = "rank " + std::to_string(rank) + " read nothing of what this rank sent for a while";
      if (!error.empty())
        break;
      pollfd writable{peer.fd, POLLOUT, 0};
      ::poll(&writable, 1, int(kWaitSlice.count()));
      continue;
    }
    const std::string why = std::strerror(errno);
    // A peer may have gone because another rank's failure stopped it, and
    // the report naming that rank can still be on its way (the reader
    // threads run apart, but it is in this rank's socket by now): give it
    // half a second before naming this peer.
    for (auto until = Clock::now() + std::chrono::milliseconds(500); !reported_ && Clock::now() < until;)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    if (reported_) {
      std::lock_guard<std::mutex> lock(stateMutex_);
      error = report_;
    } else {
      error = "rank " + std::to_string(rank) + " lost: cannot send to it (" + why + "; it exited or was killed)";
    }
    break;
  }
  if (announce && waiting)
    endWait(start);
  return size == 0;
}

bool SocketMesh::send(int64_t peer, const Frame &frame, std::string &error) {
  const WireHeader header{frame.kind, frame.payload, frame.src, frame.dst, frame.mb, int64_t(frame.bytes.size())};
  Peer &p = *peers_[peer];
  std::lock_guard<std::mutex> lock(p.sendMutex);
  const auto never = Clock::time_point::max();
  if (!write(p, peer, &header, sizeof header, never, true, error) ||
      !write(p, peer, frame.bytes.data(), frame.bytes.size(), never, true, error))
    return false;
  progressed();
  return true;
}

bool SocketMesh::receive(int64_t peer, Frame &frame, std::string &error) {
  Peer &p = *peers_[peer];
  std::unique_lock<std::mutex> lock(p.mutex);
  const auto start = Clock::now();
  Suspicion suspicion;
  bool waiting = false;
  while (p.queue.empty()) {
    if (!waiting) {
      waiting = true;
      waitingOn_ = peer;
    }
    const bool closed = p.closed;
    lock.unlock();
    std::string problem = waitProblem(peer, closed, false, suspicion);
    lock.lock();
    if (!problem.empty()) {
      waitingOn_ = -1;
      error = problem;
      return false;
    }
    if (p.queue.empty())
      p.ready.wait_for(lock, kWaitSlice);
  }
  frame = std::move(p.queue.front());
  p.queue.pop_front();
  lock.unlock();
  progressed();
  if (waiting)
    endWait(start);
  return true;
}

void SocketMesh::endWait(Clock::time_point start) {
  waitingOn_ = -1;
  // After a long wait the peers' picture of this rank (waiting, idle) is up
  // to a beat old: refresh it now rather than let it look stuck meanwhile.
  if (Clock::now() - start > beat_) {
    {
      std::lock_guard<std::mutex> lock(heartbeatMutex_);
      nudged_ = true;
    }
    heartbeatWake_.notify_all();
  }
}

std::string SocketMesh::waitProblem(int64_t peer, bool closed, bool sending, Suspicion &suspicion) {
  // A peer's report names the rank lost first; it comes before its EOF.
  if (reported_) {
    std::lock_guard<std::mutex> lock(stateMutex_);
    return report_;
  }
  if (closed)
    return "rank " + std::to_string(peer) + " lost: its connection closed (the process exited or was killed)";
  if (aborted_)
    return "stopped while waiting for rank " + std::to_string(peer) + ": another rank failed";
  const auto now = Clock::now();
  std::lock_guard<std::mutex> lock(stateMutex_);
  const int64_t stuck = stuckRank(peer, now);
  if (now - liveness_[stuck].lastProgress <= limit_) {
    suspicion.rank = -1;
    return "";
  }
  // The verdict must hold for a few beats: what a peer last said (waiting
  // on this rank, idle) may be older than what this rank just sent it.
  if (suspicion.rank != stuck) {
    suspicion.rank = stuck;
    suspicion.since = now;
  }
  if (now - suspicion.since < 3 * beat_)
    return "";
  std::string why = "rank " + std::to_string(stuck) + " is stuck: it made no progress for " +
                    seconds(limit_.count()) + " s";
  if (stuck != peer)
    why += ", and rank " + std::to_string(peer) + " waits on it";
  else if (sending)
    why += " and does not read what this rank sends";
  return why + " (--recv-timeout sets the limit)";
}

/// Follows the waits from `peer` to a rank that waits on nobody, or that has
/// stopped heartbeating (its last word on whom it waits on no longer holds).
/// Silent for half the limit is stopped: a rank stopped before the others
/// stalled is then the end of every chain before anyone's limit runs out.
int64_t SocketMesh::stuckRank(int64_t peer, Clock::time_point now) {
  const auto silent = std::max<std::chrono::duration<double>>(limit_ / 2, std::chrono::seconds(1));
  int64_t rank = peer;
  for (size_t hops = 0; hops < liveness_.size(); ++hops) {
    const Liveness &l = liveness_[rank];
    const int64_t next = l.waitingOn;
    if (now - l.lastHeartbeat > silent || next < 0 || next >= int64_t(liveness_.size()) || next == rank_ ||
        next == rank)
      return rank;
    rank = next;
  }
  return peer; // a cycle of waits: the ranks disagree on the schedule; blame the one we wait on
}

void SocketMesh::abort() { aborted_ = true; }

void SocketMesh::reportFailure(const std::string &why) {
  const WireHeader header{Frame::Failure, 0, rank_, 0, 0, int64_t(why.size())};
  for (size_t other = 0; other < peers_.size(); ++other) {
    Peer *peer = peers_[other].get();
    if (!peer)
      continue;
    std::lock_guard<std::mutex> lock(peer->sendMutex);
    const auto deadline = Clock::now() + std::chrono::seconds(1);
    std::string ignored;
    write(*peer, int64_t(other), &header, sizeof header, deadline, false, ignored) &&
        write(*peer, int64_t(other), why.data(), why.size(), deadline, false, ignored);
  }
}

} // namespace mhcc::runtime

//===- SocketMesh.cpp - CPU ranks in several processes, one socket a pair ----===//
#include "runtime/cpu/SocketMesh.h"

#include <cerrno>
#include <chrono>
#include <cstring>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <thread>
#include <unistd.h>

namespace mhcc::runtime {
namespace {

using Clock = std::chrono::steady_clock;
/// How often a waiting receive looks at the abort flag.
constexpr auto kWaitSlice = std::chrono::milliseconds(10);
/// A receive waiting longer than this tells the peers whom it waits on (and
/// again when it ends): two small frames per long wait, none in a healthy
/// step of a small model; what lets a timeout find the stuck rank.
constexpr auto kAnnounceAfter = std::chrono::seconds(1);

/// The fixed part of a frame on the wire (host byte order: one host).
struct WireHeader {
  int32_t kind, payload;
  int64_t src, dst, mb, bytes;
};

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

} // namespace

std::unique_ptr<SocketMesh> SocketMesh::connect(int64_t rank, int64_t size, const std::string &dir,
                                               double timeoutSeconds, std::string &error) {
  std::unique_ptr<SocketMesh> mesh(new SocketMesh(rank, size));
  const auto deadline = Clock::now() + std::chrono::duration<double>(timeoutSeconds);
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
                    std::to_string(int(timeoutSeconds)) + " s (did it fail to start? its message comes first)");
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    if (!writeAll(fd, &rank, sizeof rank))
      return fail("rank " + std::to_string(peer) + " closed its socket while connecting");
    mesh->peers_[peer] = std::make_unique<Peer>();
    mesh->peers_[peer]->fd = fd;
  }
  for (int64_t accepted = rank + 1; accepted < size; ++accepted) {
    pollfd waiting{listener, POLLIN, 0};
    const int ms = int(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count());
    if (ms <= 0 || ::poll(&waiting, 1, ms) <= 0)
      return fail("ranks above " + std::to_string(rank) + " did not all connect to " + mine + " within " +
                  std::to_string(int(timeoutSeconds)) + " s");
    int fd = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
    int64_t peer = -1;
    if (fd < 0 || !readAll(fd, &peer, sizeof peer) || peer <= rank || peer >= size || mesh->peers_[peer])
      return fail("a connection to " + mine + " did not name a new higher rank (a stale process?)");
    mesh->peers_[peer] = std::make_unique<Peer>();
    mesh->peers_[peer]->fd = fd;
  }
  ::close(listener);
  ::unlink(mine.c_str()); // connected sockets outlive their file
  const timeval sendLimit{long(timeoutSeconds), 0};
  for (auto &peer : mesh->peers_)
    if (peer) {
      ::setsockopt(peer->fd, SOL_SOCKET, SO_SNDTIMEO, &sendLimit, sizeof sendLimit);
      peer->reader = std::thread([m = mesh.get(), p = peer.get()] { m->readLoop(*p); });
    }
  return mesh;
}

SocketMesh::~SocketMesh() {
  for (auto &peer : peers_)
    if (peer) {
      ::shutdown(peer->fd, SHUT_RDWR); // ends the reader's read
      if (peer->reader.joinable())
        peer->reader.join();
      ::close(peer->fd);
    }
}

void SocketMesh::readLoop(Peer &peer) {
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
    if (ok && frame.kind == Frame::Waiting) {
      std::lock_guard<std::mutex> lock(reportMutex_);
      waitingOn_[frame.src] = frame.mb;
      continue;
    }
    if (ok && frame.kind == Frame::Failure) {
      std::lock_guard<std::mutex> lock(reportMutex_);
      if (report_.empty())
        report_ = "rank " + std::to_string(frame.src) + " reported: " + std::string(frame.bytes.begin(), frame.bytes.end());
      reported_ = true;
      continue;
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

bool SocketMesh::send(int64_t peer, const Frame &frame, std::string &error) {
  const WireHeader header{frame.kind, frame.payload, frame.src, frame.dst, frame.mb, int64_t(frame.bytes.size())};
  const int fd = peers_[peer]->fd;
  if (writeAll(fd, &header, sizeof header) && writeAll(fd, frame.bytes.data(), frame.bytes.size()))
    return true;
  error = "rank " + std::to_string(peer) + " lost: cannot send to it (" + std::strerror(errno) +
          "; it exited, was killed, or stopped reading)";
  return false;
}

bool SocketMesh::receive(int64_t peer, Frame &frame, double timeoutSeconds, std::string &error) {
  Peer &p = *peers_[peer];
  const auto start = Clock::now();
  const auto deadline = start + std::chrono::duration<double>(timeoutSeconds);
  std::unique_lock<std::mutex> lock(p.mutex);
  bool announced = false;
  while (p.queue.empty()) {
    if (!announced && Clock::now() - start > kAnnounceAfter) {
      announced = true;
      lock.unlock();
      announceWait(peer);
      lock.lock();
      continue;
    }
    // A peer's report names the rank lost first; it comes before its EOF.
    if (reported_) {
      std::lock_guard<std::mutex> reportLock(reportMutex_);
      error = report_;
      return false;
    }
    if (p.closed) {
      error = "rank " + std::to_string(peer) + " lost: its connection closed (the process exited or was killed)";
      return false;
    }
    if (aborted_) {
      error = "stopped while waiting for rank " + std::to_string(peer) + ": another rank failed";
      return false;
    }
    if (Clock::now() > deadline) {
      const int64_t stuck = stuckRank(peer);
      error = "rank " + std::to_string(stuck) + " is stuck: " +
              (stuck == peer ? std::string("it") : "rank " + std::to_string(peer) + ", waiting on it,") +
              " sent nothing within " + std::to_string(int(timeoutSeconds)) + " s (--recv-timeout sets the limit)";
      return false;
    }
    p.ready.wait_for(lock, kWaitSlice);
  }
  frame = std::move(p.queue.front());
  p.queue.pop_front();
  lock.unlock();
  if (announced)
    announceWait(-1);
  return true;
}

void SocketMesh::announceWait(int64_t peer) {
  Frame frame{Frame::Waiting, 0, rank_, 0, peer, {}};
  std::string ignored;
  for (size_t other = 0; other < peers_.size(); ++other)
    if (peers_[other])
      send(int64_t(other), frame, ignored);
}

/// Follows the waits from `peer` to a rank that waits on nobody.
int64_t SocketMesh::stuckRank(int64_t peer) {
  std::lock_guard<std::mutex> lock(reportMutex_);
  int64_t rank = peer;
  for (size_t hops = 0; hops < waitingOn_.size(); ++hops) {
    const int64_t next = waitingOn_[rank];
    if (next < 0 || next == rank_)
      return rank;
    rank = next;
  }
  return peer; // a cycle of waits: the ranks disagree on the schedule; blame the one we wait on
}

void SocketMesh::abort() { aborted_ = true; }

void SocketMesh::reportFailure(const std::string &why) {
  Frame frame{Frame::Failure, 0, rank_, 0, 0, std::vector<char>(why.begin(), why.end())};
  std::string ignored;
  for (size_t peer = 0; peer < peers_.size(); ++peer)
    if (peers_[peer])
      send(int64_t(peer), frame, ignored);
}

} // namespace mhcc::runtime

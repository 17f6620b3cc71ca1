// The cluster's switch when links have a delay (scripts/cluster.sh --delay) and the kernel
// has no netem qdisc: a learning Ethernet switch in user space that holds every frame for
// a fixed time before forwarding it.
//
//   cluster_delay_switch DELAY_US PORT...     (run inside the switch namespace)
//
// Each PORT is a network interface of this namespace (a node's link end). A packet socket
// per port receives every frame the node sends; the frame is forwarded DELAY_US
// microseconds after it arrived, to the port that last sent from its destination MAC
// address, or to every other port for broadcast, multicast and unknown destinations, as a
// bridge does. Frames leave in arrival order (a constant delay keeps them in order).
// Sent frames go through the port's queueing discipline, so cluster.sh's tbf rate limits
// still apply after the delay. A send never blocks: a frame a port cannot take (its
// socket's buffer full behind a slow link) is dropped, as a switch drops on a full
// output queue, so one slow link never stalls the others. The sockets carry a virtio-net header
// (PACKET_VNET_HDR), so offloaded frames (checksum left to the receiver, GSO bursts) pass through
// unchanged rather than arriving with a checksum nobody computed.
//
// Prints "ready" on standard output once every port is open (cluster.sh waits for it);
// runs until SIGTERM or SIGINT; prints one line per port at the end with its frames in,
// out and dropped. Built by cluster.sh on demand (g++ -O2 -std=c++20 -pthread).
#include <arpa/inet.h>
#include <linux/if_packet.h>
#include <net/ethernet.h>
#include <net/if.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;
using Mac = std::array<uint8_t, 6>;
constexpr size_t kVnetHeader = 10;  // struct virtio_net_hdr
constexpr size_t kMaxFrame = kVnetHeader + 65536;

std::atomic<bool> stopping{false};

void on_signal(int) { stopping = true; }

struct Port {
  std::string name;
  int fd = -1;
  uint64_t frames_in = 0, frames_out = 0, send_errors = 0;
};

struct Frame {
  Clock::time_point due;
  size_t from = 0;
  std::vector<uint8_t> bytes;  // virtio-net header + Ethernet frame
};

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "cluster_delay_switch: %s: %s\n", what.c_str(), std::strerror(errno));
  std::exit(1);
}

int open_port(const std::string& name) {
  const int fd = socket(AF_PACKET, SOCK_RAW, htons(ETH_P_ALL));
  if (fd < 0) die("socket(AF_PACKET) for " + name);
  const int on = 1;
  if (setsockopt(fd, SOL_PACKET, PACKET_VNET_HDR, &on, sizeof on) != 0) {
    die("PACKET_VNET_HDR on " + name);
  }
  // Our own transmissions on this port are not frames to forward.
  if (setsockopt(fd, SOL_PACKET, PACKET_IGNORE_OUTGOING, &on, sizeof on) != 0) {
    die("PACKET_IGNORE_OUTGOING on " + name);
  }
  // Room for what a shaped link queues (cluster.sh's tbf holds up to 20 ms of traffic)
  // before sends start to drop; root may exceed the system's default limit.
  const int bytes = 16 << 20;
  if (setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &bytes, sizeof bytes) != 0 &&
      setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof bytes) != 0) {
    die("SO_SNDBUF on " + name);
  }
  sockaddr_ll address{};
  address.sll_family = AF_PACKET;
  address.sll_protocol = htons(ETH_P_ALL);
  address.sll_ifindex = static_cast<int>(if_nametoindex(name.c_str()));
  if (address.sll_ifindex == 0) die("no interface " + name);
  if (bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) die("bind " + name);
  return fd;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: cluster_delay_switch DELAY_US PORT...\n");
    return 2;
  }
  char* end = nullptr;
  const long long delay_us = std::strtoll(argv[1], &end, 10);
  if (*end != '\0' || delay_us < 0 || delay_us > 10'000'000) {
    std::fprintf(stderr, "cluster_delay_switch: DELAY_US must be within [0, 10^7], got '%s'\n",
                 argv[1]);
    return 2;
  }
  const auto delay = std::chrono::microseconds(delay_us);
  std::vector<Port> ports;
  for (int i = 2; i < argc; ++i) ports.push_back({argv[i], open_port(argv[i])});
  struct sigaction action {};
  action.sa_handler = on_signal;
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);

  std::mutex mutex;
  std::condition_variable ready;
  std::deque<Frame> queue;
  std::map<Mac, size_t> where;  // source MAC -> the port it was last seen on

  std::thread sender([&] {
    std::unique_lock lock(mutex);
    while (!stopping) {
      if (queue.empty()) {
        ready.wait_for(lock, std::chrono::milliseconds(100));
        continue;
      }
      if (Clock::now() < queue.front().due) {  // wake at least every 100 ms to see stopping
        ready.wait_until(
            lock, std::min(queue.front().due, Clock::now() + std::chrono::milliseconds(100)));
        continue;
      }
      Frame frame = std::move(queue.front());
      queue.pop_front();
      const uint8_t* ethernet = frame.bytes.data() + kVnetHeader;
      Mac destination, source;
      std::memcpy(destination.data(), ethernet, 6);
      std::memcpy(source.data(), ethernet + 6, 6);
      where[source] = frame.from;
      const auto known = where.find(destination);
      const bool flood = (destination[0] & 1) != 0 || known == where.end();
      lock.unlock();
      for (size_t p = 0; p < ports.size(); ++p) {
        if (p == frame.from || (!flood && p != known->second)) continue;
        if (send(ports[p].fd, frame.bytes.data(), frame.bytes.size(), MSG_DONTWAIT) < 0) {
          ++ports[p].send_errors;  // a full buffer or a downed link: the frame is lost
        } else {
          ++ports[p].frames_out;
        }
      }
      lock.lock();
    }
  });

  std::vector<pollfd> polled;
  for (const Port& port : ports) polled.push_back({port.fd, POLLIN, 0});
  std::printf("ready\n");
  std::fflush(stdout);
  std::vector<uint8_t> buffer(kMaxFrame);
  while (!stopping) {
    if (poll(polled.data(), polled.size(), 100) < 0) {
      if (errno == EINTR) continue;
      die("poll");
    }
    for (size_t p = 0; p < ports.size(); ++p) {
      if ((polled[p].revents & POLLERR) != 0) {  // e.g. ENETDOWN from a downed link:
        int error = 0;                           // reading it clears it (else poll spins)
        socklen_t size = sizeof error;
        getsockopt(ports[p].fd, SOL_SOCKET, SO_ERROR, &error, &size);
      }
      if ((polled[p].revents & POLLIN) == 0) continue;
      const ssize_t got = recv(ports[p].fd, buffer.data(), buffer.size(), MSG_DONTWAIT);
      if (got < static_cast<ssize_t>(kVnetHeader + 14)) continue;  // nothing, or a runt
      ++ports[p].frames_in;
      Frame frame{Clock::now() + delay, p,
                  std::vector<uint8_t>(buffer.begin(), buffer.begin() + got)};
      std::lock_guard lock(mutex);
      queue.push_back(std::move(frame));
      ready.notify_one();
    }
  }
  ready.notify_one();
  sender.join();
  for (const Port& port : ports) {
    std::fprintf(stderr, "cluster_delay_switch: %s: %llu frames in, %llu out, %llu dropped\n",
                 port.name.c_str(), static_cast<unsigned long long>(port.frames_in),
                 static_cast<unsigned long long>(port.frames_out),
                 static_cast<unsigned long long>(port.send_errors));
    close(port.fd);
  }
  return 0;
}

// A data-parallel job's rendezvous store (server/engine/distributed/rendezvous_store.h): it listens
// on the one address it is given, serves only connections that say its secret, and cuts off one
// that sets oversized or too many values, logging a line for each (a few per store), while the
// job's ranks meet and all-reduce through it as before. Clients here are real sockets on loopback:
// a stranger speaking whatever it likes, and ranks through c10d's Store interface.
#include "server/engine/distributed/rendezvous_store.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/engine/distributed/collectives.h"

namespace trainerd::engine {
namespace {

using ::testing::HasSubstr;

// A plain TCP connection to host:port, or -1.
int Connect(const std::string& host, int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  ::inet_pton(AF_INET, host.c_str(), &addr.sin_addr);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Writes what it can of `data` (the other end may close midway); the bytes written.
size_t Send(int fd, const std::string& data) {
  size_t sent = 0;
  while (sent < data.size()) {
    const ssize_t n = ::send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;
    sent += static_cast<size_t>(n);
  }
  return sent;
}

// Whether the server closed `fd` within `seconds` (reads and drops whatever it sends first).
bool ClosedWithin(int fd, int seconds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  char buffer[4096];
  while (std::chrono::steady_clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    const ssize_t n = ::recv(fd, buffer, sizeof(buffer), 0);
    if (n <= 0) return true;
  }
  return false;
}

// What a c10d TCPStore client sends to set a value: VALIDATE with its magic number, then SET with
// the key and the value, each with a 64-bit length. A stranger does not know trainerd's framing,
// and the store must not take what it says as a length.
std::string TcpStoreStyleSet(const std::string& key, size_t value_bytes) {
  std::string out(1, '\x00');  // VALIDATE
  const uint32_t magic = 0x3C85F7CE;
  out.append(reinterpret_cast<const char*>(&magic), 4);
  out.push_back('\x01');  // SET
  uint64_t n = key.size();
  out.append(reinterpret_cast<const char*>(&n), 8);
  out += key;
  n = value_bytes;
  out.append(reinterpret_cast<const char*>(&n), 8);
  out.append(value_bytes, 'x');
  return out;
}

TEST(RendezvousStoreTest, ItListensOnItsHostOnlyAndNotOnEveryInterface) {
  absl::StatusOr<std::unique_ptr<StoreServer>> store = StoreServer::Start("127.0.0.2", 0, 0, 2);
  ASSERT_TRUE(store.ok()) << store.status();
  const int port = (*store)->port();
  EXPECT_EQ((*store)->address(), absl::StrCat("127.0.0.2:", port));
  // The same port on another address of this machine has nothing behind it.
  EXPECT_EQ(Connect("127.0.0.1", port), -1);
  const int fd = Connect("127.0.0.2", port);
  EXPECT_GE(fd, 0);
  ::close(fd);
  EXPECT_EQ((*store)->secret().size(), 64u);
  // A second store gets a secret of its own.
  absl::StatusOr<std::unique_ptr<StoreServer>> other = StoreServer::Start("127.0.0.2", 0, 0, 2);
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_NE((*other)->secret(), (*store)->secret());
  EXPECT_EQ(StoreServer::Start("no-such-host.invalid", 0, 0, 2).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// A stranger (no secret) is closed at once, whatever it sends, and nothing of it is kept; the
// ranks, with the secret, meet and all-reduce through the same store meanwhile.
TEST(RendezvousStoreTest, AStrangerIsClosedAndTheRanksMeetOn) {
  absl::StatusOr<std::unique_ptr<RendezvousHost>> host =
      RendezvousHost::Start("127.0.0.1", 0, 0, 2, absl::Seconds(10));
  ASSERT_TRUE(host.ok()) << host.status();
  ::testing::internal::CaptureStderr();
  std::vector<int> strangers;
  for (int i = 0; i < 64; ++i) {
    const int fd = Connect("127.0.0.1", (*host)->port());
    ASSERT_GE(fd, 0);
    // Some say c10d's set of 8 MiB, some a made-up length, some a wrong secret in the right form.
    if (i % 3 == 0) Send(fd, TcpStoreStyleSet(absl::StrCat("k", i), 8 << 20));
    if (i % 3 == 1) Send(fd, std::string("\xff\xff\xff\x7f", 4) + std::string(1 << 20, 'y'));
    if (i % 3 == 2) {
      std::string hello("\x45\x00\x00\x00\x01\x40\x00\x00\x00", 9);
      Send(fd, hello + std::string(64, 'a'));
    }
    strangers.push_back(fd);
  }
  for (int fd : strangers) {
    EXPECT_TRUE(ClosedWithin(fd, 10));
    ::close(fd);
  }
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ((*host)->stored_bytes(), 0);
  // One line each for the first five, one to say the rest are not logged: no backtraces.
  size_t lines = 0;
  for (char c : log) lines += c == '\n' ? 1 : 0;
  EXPECT_EQ(lines, 6u) << log;
  EXPECT_THAT(log, HasSubstr("closed the connection from 127.0.0.1:"));
  EXPECT_THAT(log, HasSubstr("further refused connections are not logged"));

  std::vector<float> sums(2);
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < 2; ++rank) {
    ranks.emplace_back([&, rank] {
      GroupOptions options;
      options.store_port = (*host)->port();
      options.store_secret = (*host)->secret();
      options.prefix = "job-s/1";
      options.rank = rank;
      options.world_size = 2;
      options.timeout = absl::Seconds(10);
      absl::StatusOr<std::unique_ptr<CpuGroup>> group = CpuGroup::Join(options);
      ASSERT_TRUE(group.ok()) << group.status();
      torch::Tensor t = torch::full({1}, static_cast<float>(rank + 1));
      ASSERT_TRUE((*group)->AllReduceSum(t).ok());
      sums[rank] = t.item<float>();
    });
  }
  for (std::thread& t : ranks) t.join();
  EXPECT_EQ(sums[0], 3.0f);
  EXPECT_EQ(sums[1], 3.0f);
  // A rank that says another secret is refused as such.
  absl::StatusOr<c10::intrusive_ptr<c10d::Store>> wrong =
      ConnectStore("127.0.0.1", (*host)->port(), std::string(64, '0'), absl::Seconds(5));
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kPermissionDenied) << wrong.status();
}

// One that says the secret (a peer's rank gone wrong) may set what a rank sets and no more: an
// oversized value, or many values, cut it off; the store stays small and serves the others.
TEST(RendezvousStoreTest, AConnectionThatSetsTooMuchIsCutOffAndTheStoreStaysSmall) {
  absl::StatusOr<std::unique_ptr<StoreServer>> store = StoreServer::Start("127.0.0.1", 0, 0, 2);
  ASSERT_TRUE(store.ok()) << store.status();
  auto connect = [&] {
    absl::StatusOr<c10::intrusive_ptr<c10d::Store>> client =
        ConnectStore("127.0.0.1", (*store)->port(), (*store)->secret(), absl::Seconds(10));
    EXPECT_TRUE(client.ok()) << client.status();
    return *std::move(client);
  };
  ::testing::internal::CaptureStderr();
  c10::intrusive_ptr<c10d::Store> big = connect();
  std::string error;
  try {
    big->set("huge", std::vector<uint8_t>(size_t{8} << 20, 7));
  } catch (const std::exception& e) {
    error = e.what();
  }
  // Cut off while it was still sending (the reason is in the store's log).
  EXPECT_THAT(error, HasSubstr("rendezvous store at 127.0.0.1:"));
  // Cut off: its next call finds the connection gone.
  EXPECT_THROW(big->set("small", std::vector<uint8_t>(4, 1)), std::exception);

  c10::intrusive_ptr<c10d::Store> many = connect();
  int stored = 0;
  error.clear();
  try {
    for (; stored < 64; ++stored) {
      many->set(absl::StrCat("k", stored), std::vector<uint8_t>(size_t{512} << 10, 1));
    }
  } catch (const std::exception& e) {
    error = e.what();
  }
  EXPECT_EQ(stored, 3);  // 2 MiB a connection: the fourth half mebibyte is refused
  EXPECT_THAT(error, HasSubstr("it set more than 1024 keys or 2097152 bytes"));
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_LE((*store)->stored_bytes(), int64_t{2} << 20);
  EXPECT_EQ((*store)->refused_connections(), 2);
  size_t lines = 0;
  for (char c : log) lines += c == '\n' ? 1 : 0;
  EXPECT_EQ(lines, 2u) << log;
  EXPECT_THAT(log, HasSubstr("a message of 8388621 bytes (at most 2098240)"));

  // The others are served: a set, a wait, a get, an add and a compare-and-set, as c10d has them.
  c10::intrusive_ptr<c10d::Store> rank = connect();
  rank->set("a", std::vector<uint8_t>{1, 2});
  rank->wait({"a"});
  EXPECT_EQ(rank->get("a"), (std::vector<uint8_t>{1, 2}));
  EXPECT_EQ(rank->add("n", 2), 2);
  EXPECT_EQ(rank->add("n", 3), 5);
  EXPECT_TRUE(rank->check({"a", "n"}));
  EXPECT_FALSE(rank->check({"missing"}));
  using Bytes = std::vector<uint8_t>;
  EXPECT_EQ(rank->compareSet("c", Bytes{}, Bytes{9}), Bytes{9});
  EXPECT_EQ(rank->compareSet("c", Bytes{8}, Bytes{7}), Bytes{9});
  EXPECT_TRUE(rank->deleteKey("c"));
  // A wait for a key no one sets ends within the client's bound, saying so.
  c10::intrusive_ptr<c10d::Store> waiting =
      *ConnectStore("127.0.0.1", (*store)->port(), (*store)->secret(), absl::Seconds(1));
  const auto start = std::chrono::steady_clock::now();
  try {
    waiting->wait({"never"}, std::chrono::hours(1));
    ADD_FAILURE() << "a wait for a key never set returned";
  } catch (const std::exception& e) {
    EXPECT_THAT(e.what(), HasSubstr("wait timeout after 1000ms"));
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 10);
}

// Send and Receive: rank 0's bytes arrive at rank 1 as they were, the group's timeout bounding
// each; a rank not involved takes no part.
TEST(RendezvousStoreTest, BytesSentPointToPointArriveAsSent) {
  absl::StatusOr<std::unique_ptr<RendezvousHost>> host =
      RendezvousHost::Start("127.0.0.1", 0, 0, 3, absl::Seconds(10));
  ASSERT_TRUE(host.ok()) << host.status();
  std::string sent(3 << 20, '\0');
  for (size_t i = 0; i < sent.size(); ++i) sent[i] = static_cast<char>((i * 131) % 251);
  std::string received(sent.size(), '\0');
  std::vector<absl::Status> statuses(3);
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < 3; ++rank) {
    ranks.emplace_back([&, rank] {
      GroupOptions options;
      options.store_port = (*host)->port();
      options.store_secret = (*host)->secret();
      options.prefix = "job-p2p/1";
      options.rank = rank;
      options.world_size = 3;
      options.timeout = absl::Seconds(10);
      absl::StatusOr<std::unique_ptr<CpuGroup>> group = CpuGroup::Join(options);
      ASSERT_TRUE(group.ok()) << group.status();
      if (rank == 0) {
        torch::Tensor bytes =
            torch::from_blob(sent.data(), {static_cast<int64_t>(sent.size())}, torch::kUInt8);
        statuses[rank] = (*group)->Send(bytes, 2);
      } else if (rank == 2) {
        torch::Tensor into = torch::from_blob(
            received.data(), {static_cast<int64_t>(received.size())}, torch::kUInt8);
        statuses[rank] = (*group)->Receive(into, 0);
      }
      // Every rank then takes part in the next collective, as a job's step.
      torch::Tensor t = torch::ones({1});
      EXPECT_TRUE((*group)->AllReduceSum(t).ok());
      EXPECT_EQ(t.item<float>(), 3.0f);
    });
  }
  for (std::thread& t : ranks) t.join();
  EXPECT_TRUE(statuses[0].ok()) << statuses[0];
  EXPECT_TRUE(statuses[2].ok()) << statuses[2];
  EXPECT_TRUE(received == sent);
}

}  // namespace
}  // namespace trainerd::engine

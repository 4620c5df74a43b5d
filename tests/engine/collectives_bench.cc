// `make bench` (bench/run.sh): c10d's all-reduce through CpuGroup (Gloo) on loopback, its ranks as
// threads of this process with one intra-op thread each: the latency of one all-reduce and the bus
// bandwidth (2 (n - 1) / n of the bytes per rank per second, as NCCL's tests count it) for 2 and
// 4 ranks and sizes from one float to 32 MiB; the median of the rounds. Not a test: nothing is
// asserted. Prints a table; with --json PATH also writes the figures there.
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "server/engine/distributed/collectives.h"

namespace trainerd::engine {
namespace {

struct Row {
  int ranks;
  int64_t bytes;
  double median_seconds;
  double bus_gb_per_second;
};

Row Measure(const RendezvousHost& host, int ranks, int64_t bytes, int rounds) {
  std::vector<std::vector<double>> seconds(ranks);
  std::vector<std::thread> threads;
  const std::string prefix = absl::StrCat("bench-", ranks, "-", bytes);
  for (int rank = 0; rank < ranks; ++rank) {
    threads.emplace_back([&, rank] {
      GroupOptions options;
      options.store_port = host.port();
      options.store_secret = host.secret();
      options.prefix = prefix;
      options.rank = rank;
      options.world_size = ranks;
      absl::StatusOr<std::unique_ptr<CpuGroup>> group = CpuGroup::Join(options);
      if (!group.ok()) {
        std::fprintf(stderr, "%s\n", group.status().ToString().c_str());
        return;
      }
      torch::Tensor buffer = torch::ones({std::max<int64_t>(1, bytes / 4)});
      for (int i = 0; i < 3; ++i) (void)(*group)->AllReduceSum(buffer);  // warm-up
      for (int i = 0; i < rounds; ++i) {
        (void)(*group)->Barrier();
        const auto start = std::chrono::steady_clock::now();
        (void)(*group)->AllReduceSum(buffer);
        seconds[rank].push_back(
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
      }
    });
  }
  for (std::thread& t : threads) t.join();
  // A round lasts as long as its slowest rank.
  std::vector<double> rounds_seconds;
  for (int i = 0; i < rounds && !seconds[0].empty(); ++i) {
    double slowest = 0;
    for (int rank = 0; rank < ranks; ++rank) slowest = std::max(slowest, seconds[rank].at(i));
    rounds_seconds.push_back(slowest);
  }
  std::sort(rounds_seconds.begin(), rounds_seconds.end());
  const double median = rounds_seconds.empty() ? 0 : rounds_seconds[rounds_seconds.size() / 2];
  const double bus =
      median > 0 ? 2.0 * (ranks - 1) / ranks * static_cast<double>(bytes) / median / 1e9 : 0;
  return {ranks, bytes, median, bus};
}

}  // namespace
}  // namespace trainerd::engine

int main(int argc, char** argv) {
  using trainerd::engine::RendezvousHost;
  std::string json_path;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::string(argv[i]) == "--json") json_path = argv[i + 1];
  }
  torch::set_num_threads(1);
  absl::StatusOr<std::unique_ptr<RendezvousHost>> host =
      RendezvousHost::Start("127.0.0.1", 0, 0, 4, absl::Seconds(60));
  if (!host.ok()) {
    std::fprintf(stderr, "%s\n", host.status().ToString().c_str());
    return 1;
  }
  std::vector<trainerd::engine::Row> rows;
  std::printf("c10d all-reduce (Gloo) on loopback, ranks as threads, median of the rounds\n");
  std::printf("%5s %12s %14s %14s\n", "ranks", "bytes", "latency", "bus GB/s");
  for (int ranks : {2, 4}) {
    for (int64_t bytes :
         {int64_t{4}, int64_t{4} << 10, int64_t{256} << 10, int64_t{4} << 20, int64_t{32} << 20}) {
      const int rounds = bytes >= (int64_t{4} << 20) ? 15 : 101;
      const trainerd::engine::Row row = trainerd::engine::Measure(**host, ranks, bytes, rounds);
      rows.push_back(row);
      std::printf("%5d %12lld %11.1f us %14.3f\n", row.ranks, static_cast<long long>(row.bytes),
                  row.median_seconds * 1e6, row.bus_gb_per_second);
      std::fflush(stdout);
    }
  }
  if (!json_path.empty()) {
    std::ofstream out(json_path);
    out << "[\n";
    for (size_t i = 0; i < rows.size(); ++i) {
      out << absl::StrFormat(
          "  {\"ranks\": %d, \"bytes\": %d, \"median_seconds\": %.9f, \"bus_gb_per_second\": "
          "%.6f}%s\n",
          rows[i].ranks, rows[i].bytes, rows[i].median_seconds, rows[i].bus_gb_per_second,
          i + 1 < rows.size() ? "," : "");
    }
    out << "]\n";
  }
  return 0;
}

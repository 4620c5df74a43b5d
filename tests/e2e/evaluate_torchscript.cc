// Evaluates a downloaded TorchScript classifier the way trainerd's validation pass does, so that
// the end-to-end tests can compare the two without linking LibTorch into e2e_test:
//
//   evaluate_torchscript MODEL FEATURES TARGETS ROW_SHAPE BATCH_SIZE
//
// FEATURES holds raw little-endian float32 rows of ROW_SHAPE (e.g. "1x28x28"), TARGETS one raw
// little-endian int64 class index per row. Prints "LOSS ACCURACY" (%.17g): the mean cross-entropy
// and the fraction of rows whose argmax is the target, in eval mode without autograd. Like the
// daemon it runs batches of BATCH_SIZE rows in order and sums each batch's float32 mean loss times
// its rows in float64, so that both see the same forward calls on the same batches.
#include <torch/script.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

std::vector<char> ReadFile(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) throw std::runtime_error("cannot open " + path);
  return std::vector<char>((std::istreambuf_iterator<char>(file)),
                           std::istreambuf_iterator<char>());
}

// "1x28x28" -> {1, 28, 28}.
std::vector<int64_t> ParseShape(const std::string& text) {
  std::vector<int64_t> shape;
  std::istringstream in(text);
  std::string dim;
  while (std::getline(in, dim, 'x')) shape.push_back(std::stoll(dim));
  return shape;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 6) {
    std::cerr << "usage: evaluate_torchscript MODEL FEATURES TARGETS ROW_SHAPE BATCH_SIZE\n";
    return 2;
  }
  try {
    torch::jit::Module model = torch::jit::load(argv[1]);
    model.eval();
    std::vector<char> feature_bytes = ReadFile(argv[2]);
    std::vector<char> target_bytes = ReadFile(argv[3]);
    const int64_t rows = static_cast<int64_t>(target_bytes.size() / sizeof(int64_t));
    std::vector<int64_t> shape = ParseShape(argv[4]);
    int64_t floats = rows;
    for (int64_t dim : shape) floats *= dim;
    if (static_cast<int64_t>(feature_bytes.size()) != floats * 4) {
      throw std::runtime_error("FEATURES does not hold " + std::to_string(rows) + " rows of " +
                               argv[4]);
    }
    shape.insert(shape.begin(), rows);
    const torch::Tensor features = torch::from_blob(feature_bytes.data(), shape, torch::kFloat32);
    const torch::Tensor targets = torch::from_blob(target_bytes.data(), {rows}, torch::kInt64);
    const int64_t batch = std::min<int64_t>(std::stoll(argv[5]), rows);

    torch::NoGradGuard no_grad;
    double loss_sum = 0;
    int64_t correct = 0;
    for (int64_t begin = 0; begin < rows; begin += batch) {
      const int64_t len = std::min(batch, rows - begin);
      const torch::Tensor x = features.narrow(/*dim=*/0, begin, len);
      const torch::Tensor y = targets.narrow(/*dim=*/0, begin, len);
      const torch::Tensor output = model.forward({x}).toTensor();
      loss_sum += static_cast<double>(len) * torch::cross_entropy_loss(output, y).item<float>();
      correct += output.argmax(/*dim=*/1).eq(y).sum().item<int64_t>();
    }
    std::printf("%.17g %.17g\n", loss_sum / static_cast<double>(rows),
                static_cast<double>(correct) / static_cast<double>(rows));
  } catch (const std::exception& e) {
    std::cerr << "evaluate_torchscript: " << e.what() << "\n";
    return 1;
  }
  return 0;
}

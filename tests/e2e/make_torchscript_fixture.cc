// Writes a small TorchScript module for the end-to-end tests of `trainctl submit --torchscript`,
// so that they need no Python: make_torchscript_fixture PATH INPUTS OUTPUTS saves a module "Net"
// whose forward is torch.linear(x, w, b) with w of shape [OUTPUTS, INPUTS], b of [OUTPUTS] and a
// buffer "calls" its forward never touches, as torch.jit.script(model).save(PATH) would. With a
// fourth argument "reads-file", the forward also reads /etc/hostname through torch.from_file (the
// attack that trainerd refuses). The only e2e piece that links LibTorch; e2e_test runs it as a
// process.
#include <torch/script.h>
#include <torch/torch.h>

#include <cstdint>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <string>

int main(int argc, char** argv) {
  if (argc != 4 && argc != 5) {
    std::cerr << "usage: make_torchscript_fixture PATH INPUTS OUTPUTS [reads-file]\n";
    return 2;
  }
  const bool reads_file = argc == 5 && std::string(argv[4]) == "reads-file";
  try {
    const int64_t inputs = std::stoll(argv[2]);
    const int64_t outputs = std::stoll(argv[3]);
    torch::manual_seed(5);
    torch::jit::Module m("Net");
    // nn.Module's flag, which every module scripted in Python carries (train() and eval() set it).
    m.register_attribute("training", c10::BoolType::get(), true);
    m.register_parameter("w", torch::randn({outputs, inputs}), /*is_buffer=*/false);
    m.register_parameter("b", torch::zeros({outputs}), /*is_buffer=*/false);
    m.register_buffer("calls", torch::zeros({1}));
    if (reads_file) {
      m.define(
          "def forward(self, x):\n"
          "  t = torch.from_file('/etc/hostname', False, 1)\n"
          "  return torch.linear(x, self.w, self.b) + t.sum()\n");
    } else {
      m.define("def forward(self, x):\n  return torch.linear(x, self.w, self.b)\n");
    }
    m.save(argv[1]);
  } catch (const std::exception& e) {
    std::cerr << "make_torchscript_fixture: " << e.what() << "\n";
    return 1;
  }
  return 0;
}

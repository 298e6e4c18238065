#include "tests/integration/torchscript_fixture.h"

#include <torch/script.h>
#include <torch/utils.h>

namespace trainstep::testing {

void WriteTinyTorchScript(const std::string& path, int dim, int seed) {
  torch::manual_seed(seed);
  torch::jit::Module m("TinyLM");
  // Trainable, as nn.Parameter is in Python.
  auto param = [](at::Tensor t) { return t.set_requires_grad(true); };
  m.register_parameter("emb", param(torch::randn({256, dim}) * 0.1), /*is_buffer=*/false);
  m.register_parameter("proj", param(torch::randn({dim, dim}) * 0.1), false);
  m.register_parameter("out", param(torch::randn({dim, 256}) * 0.1), false);
  m.define(R"(
def forward(self, input_ids):
    h = torch.embedding(self.emb, input_ids)
    h = torch.tanh(torch.matmul(h, self.proj))
    return torch.matmul(h, self.out)
)");
  m.save(path);
}

}  // namespace trainstep::testing

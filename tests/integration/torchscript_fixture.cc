#include "tests/integration/torchscript_fixture.h"

#include <torch/script.h>
#include <torch/utils.h>

namespace trainstep::testing {

void WriteTinyTorchScript(const std::string& path, int dim, int seed, int vocab,
                          std::optional<int> vocab_size_attribute) {
  torch::manual_seed(seed);
  torch::jit::Module m("TinyLM");
  // Trainable, as nn.Parameter is in Python.
  auto param = [](at::Tensor t) { return t.set_requires_grad(true); };
  m.register_parameter("emb", param(torch::randn({vocab, dim}) * 0.1), /*is_buffer=*/false);
  m.register_parameter("proj", param(torch::randn({dim, dim}) * 0.1), false);
  m.register_parameter("out", param(torch::randn({dim, vocab}) * 0.1), false);
  if (vocab_size_attribute.has_value()) {
    m.register_attribute("vocab_size", c10::IntType::get(),
                         static_cast<int64_t>(*vocab_size_attribute));
  }
  m.define(R"(
def forward(self, input_ids):
    h = torch.embedding(self.emb, input_ids)
    h = torch.tanh(torch.matmul(h, self.proj))
    return torch.matmul(h, self.out)
)");
  m.save(path);
}

}  // namespace trainstep::testing

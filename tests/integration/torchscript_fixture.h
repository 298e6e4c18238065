// Writes a small TorchScript language model (embedding → tanh → linear) from C++, so tests
// need no Python: forward(input_ids [B, T]) -> logits [B, T, vocab].
#ifndef TRAINSTEP_TESTS_INTEGRATION_TORCHSCRIPT_FIXTURE_H_
#define TRAINSTEP_TESTS_INTEGRATION_TORCHSCRIPT_FIXTURE_H_

#include <optional>
#include <string>

namespace trainstep::testing {

// With `vocab_size_attribute`, the module also has an int attribute vocab_size of that value
// (a model that declares its vocabulary; a test may make it disagree with `vocab`).
void WriteTinyTorchScript(const std::string& path, int dim = 16, int seed = 7, int vocab = 256,
                          std::optional<int> vocab_size_attribute = std::nullopt);

}  // namespace trainstep::testing

#endif  // TRAINSTEP_TESTS_INTEGRATION_TORCHSCRIPT_FIXTURE_H_

// Writes a small TorchScript language model (embedding → tanh → linear, vocab 256) from C++,
// so tests need no Python: forward(input_ids [B, T]) -> logits [B, T, 256].
#ifndef TRAINSTEP_TESTS_INTEGRATION_TORCHSCRIPT_FIXTURE_H_
#define TRAINSTEP_TESTS_INTEGRATION_TORCHSCRIPT_FIXTURE_H_

#include <string>

namespace trainstep::testing {

void WriteTinyTorchScript(const std::string& path, int dim = 16, int seed = 7);

}  // namespace trainstep::testing

#endif  // TRAINSTEP_TESTS_INTEGRATION_TORCHSCRIPT_FIXTURE_H_
